"""The chaos run: the product's guarantees checked from outside, under real faults.

`python -m tests.chaos` creates a PostgreSQL cluster of its own (never the shared one), starts
the product's processes against it (several `runworker`, two `runscheduler`, two
`rundispatcher`, one `runall`), each behind a TCP proxy of its own, drives load through them
from several client processes and a webhook sender, and kills, stalls and disconnects them,
delays, silences and resets their network, and restarts or stops PostgreSQL (or, with
`--failover`, promotes its synchronous standby), on a schedule drawn from a seed. Then it
drains and checks, from what the database, the loopback receivers and the clients recorded,
that nothing was lost, duplicated or committed twice.

- `plan`: the seeded plan (inboxes, deliveries, fault schedule); pure, replayable.
- `cluster`: the run's own PostgreSQL cluster (pg_createcluster ... pg_dropcluster), and its
  synchronous standby for the failover.
- `proxies`: one userspace TCP proxy per process, between it and PostgreSQL.
- `agent`: the agent the workers run; side effects through `run.key(...)` into a ledger.
- `clients`: ingesters and the approval answerer, as processes that faults can hit.
- `network`: the loopback webhook and SMTP receivers, and the signed-webhook sender.
- `fleet`: the product's processes and the clients, restarted after each kill.
- `state`: setup, drain status and the final dump, through the ORM.
- `check`: the invariants, as a pure function of what was recorded, and the table.
- `run`: the orchestration.
"""
