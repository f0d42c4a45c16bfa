"""Traces of the stack's requests and switches (adr/0042).

record: a request's spans as plain timestamps, cheap enough to take on every request (the console's waterfall
keeps the last ones: buffer); export: the same spans handed to OpenTelemetry's SDK and OTLP exporter once the
request is over, for the requests sampled, when a collector is configured (settings). Nothing here imports the
OpenTelemetry SDK until export is on: a gateway that does not export never loads it.
"""
