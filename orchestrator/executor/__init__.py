"""Ray executor: cluster connection, one actor per GPU (gangs for tp > 1), the dispatch loop.

- cluster.py   connect to / start Ray, count worker slots per node
- actors.py    the worker actor (runs cases through a runner function, keeps a SessionCache)
- gangs.py     placement groups of tp actors and their torch.distributed rendezvous
- config.py    ExecConfig, the deferral of cases a warm-up compiles for, group keys
- pool.py      the gang pool (pure): slots, widths, what is held and free, which gang a task gets
- attempts.py  a case's attempts (pure): retries, flaky, widening, lost batches and nodes, not-run
- executor.py  the Ray loop: places, starts, joins, runs and kills gangs; deadlines
- verdicts.py  what a result means there: device faults that recycle a worker, a retry's verdict
- progress.py  a live bar on a TTY, a line per 10% in CI logs
"""
