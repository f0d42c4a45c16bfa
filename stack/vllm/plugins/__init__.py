"""What runs inside vLLM's processes, and the wire protocols between them and the stack: one module each.

- `runtime_patches/`: the patch ledger's runtime patches (patches/ledger.yaml `kind: plugin`), applied in every
  vLLM process by the `vllm.general_plugins` entry point (stack.patches.plugin reads the ledger and calls them);
- `handoff`: GPU memory handed from a sleeping engine to the waking one (the manager's broker and the pieces);
- `start_gate`: an engine held before its device until a file exists (the tune's pre-started engines);
- `host_copy`: an engine keeping its weights' host copy between sleeps, and staging it;
- `runtime_switches`: the environment switches that decide whether a vLLM process runs a runtime patch.
Nothing here imports the rest of the stack beyond stack.vllm: these modules load inside vLLM.
"""
