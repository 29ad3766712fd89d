"""The series a node exports: each one's Prometheus name, where its value is read, and
its HELP text. RabbitMQ's names (its ``rabbitmq_prometheus`` plugin) with ``warren_`` for
``rabbitmq_`` where Warren has the same figure, Warren's own names for the rest.

Each ``Figure`` reads one key of an actor's answer (``QueueStats`` of a queue or of a
stream, ``StoreStats``, ``ListenerStats``, an actor's runtime ``stats``) or of the node's
own figures (its alarm readings, its counters); a histogram's key holds a reading of
``warren.store.latency``. Only figures the code really keeps are here; ``warren.
supervisor.node.metrics`` gathers them and renders the families. A counter's name is
without the ``_total`` its samples carry (prometheus_client adds it). Nothing here runs
but ``dead_lettered``, a name, and ``exported``, which lists the tables: so the list a
user reads in docs/metrics.md, the dashboard in deploy/grafana, and the code stay one
(their tests check them against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from warren.queues.broker.dead_letters import REASONS as DEAD_LETTER_REASONS


@dataclass(frozen=True)
class Figure:
    """One series: its name (a counter's without the ``_total`` its samples carry), the
    key of the answer its value is read from, and its HELP text."""

    name: str
    key: str
    help: str
    scale: float = 1.0


QUEUE_GAUGES = (
    Figure(
        "warren_queue_messages_ready",
        "messages_ready",
        "Messages ready to be delivered to consumers",
    ),
    Figure(
        "warren_queue_messages_unacked",
        "messages_unacked",
        "Messages delivered to consumers but not yet acknowledged",
    ),
    Figure("warren_queue_messages", "depth", "Sum of ready and unacknowledged messages"),
    Figure("warren_queue_messages_persistent", "persistent", "Persistent messages"),
    Figure(
        "warren_queue_messages_ready_ram",
        "alpha",
        "Ready messages held in memory, body and index (alpha)",
    ),
    Figure(
        "warren_queue_messages_unacked_ram",
        "pending_acks_ram",
        "Unacknowledged messages held in memory",
    ),
    Figure(
        "warren_queue_messages_ram_bytes",
        "ram_bytes",
        "Size in bytes of the ready and unacknowledged messages held in memory",
    ),
    Figure(
        "warren_queue_messages_disk_bytes",
        "disk_bytes",
        "Size in bytes of the messages whose bodies are on disk",
    ),
    Figure(
        "warren_queue_messages_unconfirmed",
        "unconfirmed",
        "Messages taken but not yet confirmed to their publishers",
    ),
    Figure("warren_queue_consumers", "consumers", "Consumers on a queue"),
)
VARIABLE_QUEUE_STATES = ("alpha", "beta", "gamma", "delta")
VARIABLE_QUEUE_FAMILY = "warren_queue_variable_queue_messages"
VARIABLE_QUEUE_HELP = (
    "Messages by variable-queue state: alpha (body and index in memory), beta (index in "
    "memory, body on disk), gamma (index in memory and on disk), delta (both on disk only)"
)
QUEUE_COUNTERS = (
    Figure(
        "warren_queue_messages_published",
        "published",
        "Messages published to the queue and taken by it",
    ),
    Figure(
        "warren_queue_messages_confirmed",
        "confirmed",
        "Messages confirmed to their publishers (on disk, when persistent)",
    ),
    Figure("warren_queue_messages_delivered", "delivered", "Messages delivered to consumers"),
    Figure(
        "warren_queue_messages_redelivered",
        "redelivered",
        "Messages delivered again, flagged redelivered",
    ),
    Figure(
        "warren_queue_messages_acknowledged",
        "acknowledged",
        "Messages acknowledged by consumers",
    ),
    Figure(
        "warren_queue_messages_released",
        "released",
        "Unacknowledged messages put back because their consumer ended",
    ),
    Figure(
        "warren_queue_messages_expired",
        "expired",
        "Messages expired by a TTL: dropped, or dead-lettered when the queue has a "
        "dead-letter exchange",
    ),
    Figure(
        "warren_queue_messages_dropped_max_length",
        "dropped_over_max_length",
        "Messages dropped from the head by max-length (overflow drop-head)",
    ),
    Figure(
        "warren_queue_messages_rejected_publishes",
        "rejected_publishes",
        "Published messages refused by max-length (overflow reject-publish)",
    ),
    Figure(
        "warren_queue_dedup_repeats",
        "repeats_dropped",
        "Messages a deduplicating producer sent again, already taken, and dropped",
    ),
    Figure(
        "warren_queue_messages_recovered",
        "recovered",
        "Persistent messages the queue recovered from disk at its starts",
    ),
    Figure(
        "warren_queue_corrupt_reads",
        "corrupt_on_read",
        "Message bodies that failed their check when read: dropped, never delivered",
    ),
    Figure(
        "warren_queue_missing_reads",
        "missing_on_read",
        "Message bodies the store no longer held when the queue read them",
    ),
    Figure(
        "warren_queue_foreign_delivery_tags",
        "foreign_tags",
        "Delivery tags a connection settled without holding them, ignored",
    ),
)
# Labelled by reason (``warren.queues.broker.dead_letters``), each reason read from the
# answer's ``dead_lettered_<reason>``.
DEAD_LETTERED = Figure(
    "warren_queue_messages_dead_lettered",
    "dead_lettered",
    "Messages dead-lettered and confirmed by the dead-letter exchange's queues, by reason: "
    "expired (a TTL), rejected (a consumer's reject without requeue), maxlen (dropped by "
    "max-length)",
)


def dead_lettered(reason: str) -> str:
    """The ledger's name of a queue's dead letters of one reason."""
    return f"{DEAD_LETTERED.name} reason={reason}"


STREAM_GAUGES = (
    Figure("warren_stream_segments", "segments", "Segment files of the stream"),
    Figure(
        "warren_stream_bytes",
        "bytes",
        "Size in bytes of the stream's segment and index files",
    ),
    Figure(
        "warren_stream_consumers",
        "consumers",
        "Named consumers with an offset stored in the stream",
    ),
    Figure(
        "warren_stream_producers",
        "producers",
        "Producers whose last sequence the stream keeps (deduplication)",
    ),
)
# A stream's offsets, on the per-object page only: a sum of offsets means nothing.
STREAM_OFFSETS = (
    Figure(
        "warren_stream_first_offset",
        "first_offset",
        "First offset the stream holds (retention moves it on; the next offset when empty)",
    ),
    Figure(
        "warren_stream_committed_offset",
        "committed_offset",
        "Last offset made durable and readable (-1 before any)",
    ),
    Figure(
        "warren_stream_last_offset",
        "last_offset",
        "Last offset written, committed or not (-1 before any)",
    ),
)
STREAM_CONSUMER_OFFSETS = "consumer_offsets"  # the key of each named consumer's figures
STREAM_CONSUMER_GAUGES = (
    Figure(
        "warren_stream_consumer_offset",
        "offset",
        "Offset a named consumer stored: the last record it processed",
    ),
    Figure(
        "warren_stream_consumer_lag",
        "lag",
        "Records committed after a named consumer's stored offset: what it has yet to read",
    ),
)
STREAM_COUNTERS = (
    Figure(
        "warren_stream_messages_published",
        "published",
        "Messages published to the stream and taken by it",
    ),
    Figure(
        "warren_stream_messages_confirmed",
        "confirmed",
        "Messages confirmed to their publishers (on disk, under sync_policy fsync)",
    ),
    Figure(
        "warren_stream_dedup_repeats",
        "repeats_dropped",
        "Messages a deduplicating producer sent again, already taken, and dropped",
    ),
    Figure(
        "warren_stream_records_read",
        "records_read",
        "Records the stream's process read for readers (remote ones; local readers read "
        "the files themselves)",
    ),
    Figure(
        "warren_stream_offsets_stored",
        "offsets_stored",
        "Offsets stored for named consumers",
    ),
    Figure(
        "warren_stream_segments_deleted",
        "segments_deleted",
        "Segments deleted by retention (max_length_bytes, max_age)",
    ),
    Figure(
        "warren_stream_sync_ops",
        "syncs",
        "Group commits that made chunks durable (fdatasync under sync_policy fsync)",
    ),
)
PUBLISHED = "warren_queue_messages_published"
STREAM_PUBLISHED = "warren_stream_messages_published"
# RabbitMQ's global counters, counted at Warren's queues and streams, so a message routed
# to two queues counts twice: (name, the queue and stream counters it sums, help).
GLOBAL_COUNTERS = (
    (
        "warren_global_messages_received_confirm",
        (
            PUBLISHED,
            "warren_queue_dedup_repeats",
            "warren_queue_messages_rejected_publishes",
            STREAM_PUBLISHED,
            "warren_stream_dedup_repeats",
        ),
        "Messages received by the queues and streams from publishers expecting confirms "
        "(every Warren publish does)",
    ),
    (
        "warren_global_messages_routed",
        (PUBLISHED, STREAM_PUBLISHED),
        "Messages routed to queues and streams and taken",
    ),
    (
        "warren_global_messages_confirmed",
        ("warren_queue_messages_confirmed", "warren_stream_messages_confirmed"),
        "Messages confirmed to publishers",
    ),
    (
        "warren_global_messages_delivered",
        ("warren_queue_messages_delivered",),
        "Messages delivered to consumers",
    ),
    (
        "warren_global_messages_redelivered",
        ("warren_queue_messages_redelivered",),
        "Messages redelivered to consumers",
    ),
    (
        "warren_global_messages_acknowledged",
        ("warren_queue_messages_acknowledged",),
        "Messages acknowledged by consumers",
    ),
    (
        "warren_global_messages_dead_lettered_confirmed",
        tuple(dead_lettered(reason) for reason in DEAD_LETTER_REASONS),
        "Messages dead-lettered and confirmed by the target queues",
    ),
)
STORE_GAUGES = (
    Figure("warren_msg_store_messages", "message_count", "Messages the store holds"),
    Figure("warren_msg_store_files", "file_count", "Data files of the store"),
    Figure("warren_msg_store_bytes", "bytes_on_disk", "Size in bytes of the store's data files"),
    Figure(
        "warren_msg_store_valid_bytes",
        "valid_bytes",
        "Bytes of the store's data files that hold messages still referenced",
    ),
    Figure(
        "warren_msg_store_garbage_ratio",
        "garbage_fraction",
        "Fraction of the store's bytes that are garbage, for the GC to reclaim",
    ),
    Figure(
        "warren_msg_store_locked_files",
        "locked_files",
        "Data files a GC combine is working on",
    ),
    Figure("warren_msg_store_clients", "clients", "Clients (queues) registered with the store"),
    Figure("warren_msg_store_disk_full", "disk_full", "1 while the store finds the disk full"),
    Figure(
        "warren_msg_store_writes_blocked",
        "writes_blocked",
        "1 while the store holds its clients' writes (the disk alarm)",
    ),
    Figure(
        "warren_msg_store_recovered_clean",
        "recovered_clean",
        "1 when the store's last start found its clean-shutdown files",
    ),
    Figure(
        "warren_msg_store_longest_confirm_wait_seconds",
        "longest_confirm_wait_ms",
        "Longest wait of a write batch for its confirm since the store started",
        scale=0.001,
    ),
    Figure(
        "warren_msg_store_longest_gc_slice_seconds",
        "longest_gc_slice_ms",
        "Longest time a GC step held the store's loop since the store started",
        scale=0.001,
    ),
)
STORE_HISTOGRAMS = (
    Figure(
        "warren_msg_store_confirm_wait_seconds",
        "confirm_wait_seconds",
        "Wait of each write batch from its arrival at the store to its confirm (the sync included)",
    ),
    Figure(
        "warren_msg_store_sync_duration_seconds",
        "sync_duration_seconds",
        "Time each group commit's sync took: the flush, and the fdatasync under sync_policy fsync",
    ),
)
STORE_COUNTERS = (
    Figure("warren_msg_store_read", "reads", "Read operations in the message store"),
    Figure("warren_msg_store_write", "writes", "Write operations in the message store"),
    Figure(
        "warren_msg_store_sync_ops",
        "syncs",
        "fdatasync and fsync calls that made writes durable (group commits, file rollovers)",
    ),
    Figure("warren_msg_store_removes", "removes", "Message references removed from the store"),
    Figure("warren_msg_store_write_batches", "batches", "Write batches taken from clients"),
    Figure(
        "warren_msg_store_direct_reads",
        "direct_reads_reported",
        "Reads clients made from the store's files themselves, as they reported them",
    ),
    Figure(
        "warren_msg_store_fallback_reads",
        "fallback_reads",
        "Reads the store served itself, when a client could not read the file",
    ),
    Figure("warren_msg_store_gc_runs", "gc_runs", "Pairs of files combined by the GC"),
    Figure(
        "warren_msg_store_gc_compactions",
        "gc_compactions",
        "Files compacted in place by the GC",
    ),
    Figure(
        "warren_msg_store_gc_bytes_moved",
        "gc_bytes_moved",
        "Bytes the GC copied while combining or compacting files",
    ),
    Figure(
        "warren_msg_store_gc_bytes_reclaimed",
        "gc_bytes_reclaimed",
        "Bytes cut off compacted files",
    ),
    Figure(
        "warren_msg_store_gc_jobs_abandoned",
        "gc_jobs_abandoned",
        "GC jobs given up (readers held a file, or the GC failed)",
    ),
    Figure(
        "warren_msg_store_gc_yields",
        "gc_yields",
        "GC jobs after which the GC waited for the store's writers (its share of loop and time)",
    ),
    Figure(
        "warren_msg_store_gc_yield_seconds",
        "gc_yield_seconds",
        "Seconds the GC waited for the store's writers",
    ),
    Figure("warren_msg_store_files_deleted", "files_deleted", "Data files deleted when empty"),
    Figure(
        "warren_msg_store_writes_failed_disk_full",
        "writes_failed_disk_full",
        "Writes that failed because the disk was full",
    ),
)
ACTOR_COUNTERS = (
    Figure(
        "warren_actor_messages_received",
        "received",
        "Messages the actor's mailbox took",
    ),
    Figure(
        "warren_actor_messages_malformed",
        "malformed",
        "Messages refused because they did not decode or had the wrong shape",
    ),
    Figure(
        "warren_actor_messages_unhandled",
        "unhandled",
        "Messages of a kind the actor does not handle",
    ),
    Figure(
        "warren_actor_messages_dropped_stale",
        "dropped_stale",
        "Messages sent to an earlier incarnation of the actor, dropped",
    ),
    Figure(
        "warren_actor_replies_unroutable",
        "unroutable",
        "Replies the actor could not send because the asker had gone",
    ),
    Figure(
        "warren_actor_mailbox_backlogged_passes",
        "backlogged_passes",
        "Passes of the actor's loop that left messages waiting in its mailbox after max_batch "
        "messages or 8 MiB, or after max_batch messages since it was last empty: the actor "
        "falls behind",
    ),
)
CPU_SECONDS = Figure(
    "warren_actor_cpu_seconds", "cpu_seconds", "CPU time (user and system) of the actor's process"
)
LISTENER_GAUGES = (
    Figure(
        "warren_listener_clients_consuming",
        "clients_consuming",
        "Remote clients consuming through the listener now",
    ),
    Figure(
        "warren_connections",
        "connections",
        "Tcp connections of remote clients open to the listener now (a client holds one, "
        "and a second while it consumes)",
    ),
)
LISTENER_COUNTERS = (
    Figure(
        "warren_connections_opened",
        "connections_opened",
        "Tcp connections of remote clients the listener accepted",
    ),
    Figure(
        "warren_connections_closed",
        "connections_closed",
        "Tcp connections of remote clients that closed",
    ),
    Figure("warren_listener_requests", "requests", "Requests from remote clients"),
    Figure("warren_listener_requests_refused", "refused", "Requests from remote clients refused"),
    Figure(
        "warren_listener_requests_malformed",
        "malformed",
        "Requests from remote clients that were not well formed",
    ),
    Figure(
        "warren_curve_clients_refused",
        "clients_refused",
        "Remote clients refused because their CURVE key is not authorized",
    ),
)
AMQP_GAUGES = (
    Figure(
        "warren_amqp_connections",
        "connections",
        "AMQP 0-9-1 client connections open to the AMQP port now",
    ),
    Figure(
        "warren_amqp_output_waiting_bytes",
        "output_waiting_bytes",
        "Bytes the AMQP port has for its clients that they have not read yet",
    ),
)
AMQP_COUNTERS = (
    Figure(
        "warren_amqp_connections_opened",
        "connections_opened",
        "AMQP client connections the AMQP port accepted",
    ),
    Figure(
        "warren_amqp_connections_closed",
        "connections_closed",
        "AMQP client connections that closed",
    ),
    Figure(
        "warren_amqp_clients_failed",
        "clients_failed",
        "AMQP clients closed by an error of the port serving them (541 INTERNAL_ERROR)",
    ),
    Figure(
        "warren_amqp_connections_refused_for_descriptors",
        "refused_for_descriptors",
        "AMQP connections refused because the port was short of file descriptors",
    ),
    Figure(
        "warren_amqp_logins_refused_busy",
        "logins_refused_busy",
        "AMQP logins refused because too many were being checked already",
    ),
    Figure(
        "warren_amqp_messages_published",
        "messages_published",
        "Messages AMQP clients published that the port handed to the node",
    ),
)
QUORUM_GAUGES = (  # a quorum queue's log (per queue only)
    Figure(
        "warren_quorum_queue_last_written_index",
        "last_written_index",
        "Index of the last log entry of the quorum queue known durable in the WAL",
    ),
    Figure(
        "warren_quorum_queue_last_applied_index",
        "last_applied_index",
        "Index of the last log entry applied to the quorum queue's state",
    ),
    Figure(
        "warren_quorum_queue_snapshot_index",
        "snapshot_index",
        "Index of the quorum queue's latest snapshot (the log below what it needs is gone)",
    ),
    Figure(
        "warren_quorum_queue_term",
        "term",
        "Term of the quorum queue's new log entries: its node's cluster epoch, 1 alone",
    ),
    Figure(
        "warren_quorum_queue_commit_latency_seconds",
        "commit_latency_s",
        "How long the quorum queue's last waited hand-over to the WAL took (its group commit)",
    ),
)
WAL_GAUGES = (
    Figure("warren_wal_files", "files", "Files of quorum queues' write-ahead log on disk"),
    Figure(
        "warren_wal_records_per_sync",
        "records_per_sync",
        "Record batches (one per queue and pass) covered by one fdatasync of the WAL, on average",
    ),
)
WAL_COUNTERS = (
    Figure("warren_wal_syncs", "syncs", "fdatasyncs of quorum queues' write-ahead log"),
    Figure("warren_wal_bytes_written", "bytes_written", "Bytes written to the WAL"),
    Figure(
        "warren_wal_segment_writes",
        "segment_writes",
        "A queue's entries moved from a closed WAL file to its segment files",
    ),
)
CLUSTER_GAUGES = (
    Figure(
        "warren_cluster_leader",
        "leading",
        "1 while this node leads its cluster (its etcd lease known alive), else 0",
    ),
    Figure(
        "warren_cluster_epoch",
        "epoch",
        "The epoch of the cluster's leader as this node sees it (the leader key's etcd revision)",
    ),
    Figure(
        "warren_cluster_isr_members",
        "isr_members",
        "Nodes in the cluster's in-sync replica set (ISR)",
    ),
    Figure("warren_cluster_nodes_up", "nodes_up", "Nodes of the cluster whose etcd lease lives"),
    Figure(
        "warren_cluster_etcd_members_healthy",
        "etcd_healthy",
        "etcd members whose last health check this node made answered healthy",
    ),
)
CLUSTER_COUNTERS = (
    Figure("warren_cluster_elections_won", "elections_won", "Elections this node won"),
)
# A leader's, one sample per follower it ships to (label "follower").
FOLLOWER_GAUGES = (
    Figure(
        "warren_cluster_follower_lag_actions",
        "lag_actions",
        "Replicated actions the leader wrote that this follower has not acknowledged",
    ),
    Figure(
        "warren_cluster_follower_lag_bytes",
        "lag_bytes",
        "Bytes of data in the actions this follower has not acknowledged",
    ),
)
NODE_COUNTERS = (
    Figure(
        "warren_node_control_calls_refused",
        "refused_control_calls",
        "Calls on the node's control socket it refused",
    ),
    Figure(
        "warren_node_status_requests_malformed",
        "malformed_status_requests",
        "Requests on the node's control socket that were not well formed",
    ),
)
RESOURCE_GAUGES = (
    Figure(
        "warren_process_resident_memory_bytes",
        "memory_bytes",
        "Memory used by the node's processes, in bytes: their proportional set sizes, as the "
        "memory alarm reads them (each process's last PSS reading and what its RSS grew since)",
    ),
    Figure(
        "warren_resident_memory_limit_bytes",
        "memory_limit_bytes",
        "Memory high watermark in bytes: the memory alarm's limit",
    ),
    Figure(
        "warren_disk_space_available_bytes",
        "disk_free_bytes",
        "Disk space available to the data directory, in bytes",
    ),
    Figure(
        "warren_disk_space_available_limit_bytes",
        "disk_free_limit_bytes",
        "Free disk space low watermark in bytes: the disk alarm's limit",
    ),
)
ALARMS = (
    Figure("warren_alarms_memory_used_watermark", "memory", "1 while the memory alarm is raised"),
    Figure("warren_alarms_free_disk_space_watermark", "disk", "1 while the disk alarm is raised"),
    Figure(
        "warren_alarms_replication",
        "replication",
        "1 while a cluster leader's ISR holds fewer nodes than min_insync",
    ),
)
IDENTITY = Figure("warren_identity_info", "", "The node, named by the warren_node label")
QUEUES_DECLARED = Figure("warren_queues", "", "Queues declared on the node")
CONSUMERS = Figure("warren_consumers", "consumers", "Consumers on the queues that answered")
START_SECONDS = Figure(
    "warren_node_start_seconds",
    "",
    "Seconds the node's last start took, the recovery of its stores and queues included",
)
UNANSWERED = Figure(
    "warren_scrape_actors_unanswered",
    "",
    "Actors whose figures this scrape could neither read nor get an answer for in time: "
    "their series are missing",
)
ACTORS_RUNNING = Figure("warren_actors", "", "Actors the node's tree runs")
QUEUE_STATES = ("starting", "running", "restarting", "crashed")
QUEUE_STATE = Figure(
    "warren_queue_state",
    "",
    "1 for the queue's state now and 0 for the others (node-wide: the queues in each): "
    "starting (the node starts), running, restarting (between two processes), crashed "
    "(it kept crashing and stays down)",
)
STREAM_STATE = Figure(
    "warren_stream_state",
    "",
    "1 for the stream's state now and 0 for the others (node-wide: the streams in each), "
    "as warren_queue_state's",
)
ACTOR_RESTARTS = Figure(
    "warren_actor_restarts",
    "",
    "Times the actor's process was started again since the node started",
)
ACTOR_MEMORY = Figure(
    "warren_actor_resident_memory_bytes",
    "",
    "Resident set size of the actor's process in bytes (pages it shares with other "
    "actors counted in each)",
)


def exported() -> dict[str, str]:
    """Every family a node can export, named as its samples are (a counter's with
    ``_total``; a histogram's samples add ``_bucket``, ``_sum`` and ``_count``), with its
    type: ``counter``, ``gauge`` or ``histogram``."""
    counters = [
        *QUEUE_COUNTERS,
        DEAD_LETTERED,
        *STREAM_COUNTERS,
        *STORE_COUNTERS,
        *ACTOR_COUNTERS,
        *LISTENER_COUNTERS,
        *AMQP_COUNTERS,
        *WAL_COUNTERS,
        *CLUSTER_COUNTERS,
        *NODE_COUNTERS,
        CPU_SECONDS,
        ACTOR_RESTARTS,
    ]
    gauges = [
        *QUEUE_GAUGES,
        *STREAM_GAUGES,
        *STREAM_OFFSETS,
        *STREAM_CONSUMER_GAUGES,
        *STORE_GAUGES,
        *LISTENER_GAUGES,
        *AMQP_GAUGES,
        *QUORUM_GAUGES,
        *WAL_GAUGES,
        *CLUSTER_GAUGES,
        *FOLLOWER_GAUGES,
        *RESOURCE_GAUGES,
        *ALARMS,
        IDENTITY,
        QUEUES_DECLARED,
        CONSUMERS,
        START_SECONDS,
        UNANSWERED,
        ACTORS_RUNNING,
        ACTOR_MEMORY,
        QUEUE_STATE,
        STREAM_STATE,
    ]
    names = {figure.name + "_total": "counter" for figure in counters}
    names.update({name + "_total": "counter" for name, _, _ in GLOBAL_COUNTERS})
    names.update({figure.name: "gauge" for figure in gauges})
    names[VARIABLE_QUEUE_FAMILY] = "gauge"
    names.update({figure.name: "histogram" for figure in STORE_HISTOGRAMS})
    return names
