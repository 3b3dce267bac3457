"""Infrastructure: how Hermes runs and reaches its servers.

Connections to Temporal and Redis (TLS included), the embedded stack and the servers a
command uses, LanceDB connections and the durable store beside the memory tables, Redis
key names and the writes the README promises, the workers' run cache, rolling deploys,
process-level settings, OpenTelemetry, and reading the configuration files users write.
Nothing here knows what a session says; the modules are imported by name
(``from hermes.infra import stack``), this package re-exports nothing.
"""
