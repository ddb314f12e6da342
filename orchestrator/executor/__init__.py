"""Ray executor: cluster connection, one actor per GPU (gangs for tp > 1), the dispatch loop.

- cluster.py   connect to / start Ray, count worker slots per node
- actors.py    the worker actor (runs cases through a runner function, keeps a SessionCache)
- gangs.py     placement groups of tp actors and their torch.distributed rendezvous
- executor.py  the dispatch loop: batching, deadlines, crash/hang/device-error handling, retries
- verdicts.py  what a result means there: device faults that recycle a worker, a retry's verdict
- progress.py  a live bar on a TTY, a line per 10% in CI logs
"""
