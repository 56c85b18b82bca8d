"""The MoE inference server, in rooms that import downwards only: the front ends (frontends/) ->
scheduling (scheduling/) -> telemetry (telemetry/) -> the engine (engine/) -> expert
parallelism's machinery (parallel/); the wiring (app.py, build.py, settings.py) above them all,
the domain errors (errors.py) beside them; the tools (tools/). docs/design.md maps each module."""
