"""Tensor parallelism: the probe's conditions run by N worker processes (torch.distributed).

    source.py       the tensor-parallel source: the static probe's conditions per degree
    degrees.py      --tp as typed -> degrees; the checks made before any process starts
    job.py          what one worker group runs (frozen, pickled to every rank): conditions or a bisect
    load.py         a worker's model: transformers' tp_plan="auto" at degree > 1
    worker.py       one rank: process group, model, its conditions (or bisect), results to the parent
    group.py        start, supervise and stop a worker group (a dead rank stops them all)
    summary.py      batch variance at each degree and each degree against the reference degree
    bisect.py       bisect of a --tp run at the divergent condition's own degree (run_tp_bisect)
    bisect_rank.py  the lockstep and ablation on the ranks (rank 0 decides, the others follow)
    collective.py   capture of a row-parallel linear's all-reduce (op class "collective")
The source ties the next six to the probe loop; it builds on the static axis (static/source.py:
the same conditions, replayed the same way on every rank).
"""
