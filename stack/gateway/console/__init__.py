"""The console: a browser UI on the gateway's own port (/ui/), served offline from this package.

`mount.install(app, state, sources)` mounts it; stack.gateway.app calls it when `gateway.console` is on. The pages
are static HTML + plain JavaScript (uPlot vendored for the charts, static/vendor/VENDORED.md); data comes from
/ui/api/* (JSON) and one Server-Sent Events stream per open page (stack.gateway.console.hub). adr/0018.
"""

# Nothing imported here: the CLI and `vstack up` name ConsoleSources (console.sources, plain dataclasses) before
# the gateway's web modules load, which must wait until the engine has started (adr/0023).
