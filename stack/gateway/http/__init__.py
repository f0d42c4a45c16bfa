"""The gateway's http room: routes (/v1, /admin, /health, /metrics, /docs), keys, the one place errors become
responses, the request-body limit, client aborts, slow-client deadlines, the request log and the uvicorn
server. It hands each request to routing (stack.gateway.routing) and turns the answer into the response."""
