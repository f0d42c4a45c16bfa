"""The console: a browser UI on the gateway's own port (/ui/), served offline from this package.

`install(app, state, sources)` mounts it; stack.gateway.app calls it when `gateway.console` is on. The pages
are static HTML + plain JavaScript (uPlot vendored for the charts, static/vendor/VENDORED.md); data comes from
/ui/api/* (JSON) and one Server-Sent Events stream per open page (stack.gateway.console.hub). adr/0018.
"""

from stack.gateway.console.routes import install
from stack.gateway.console.sources import ConsoleSources

__all__ = ["ConsoleSources", "install"]
