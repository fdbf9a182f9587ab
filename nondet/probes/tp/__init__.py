"""Tensor parallelism: the probe's conditions run by N worker processes (torch.distributed).

    degrees.py  --tp as typed -> degrees; the checks made before any process starts
    job.py      what one worker group runs (frozen, pickled to every rank)
    load.py     a worker's model: transformers' tp_plan="auto" at degree > 1
    worker.py   one rank: process group, model, every condition of its group, results to the parent
    group.py    start, supervise and stop a worker group (a dead rank stops them all)
    summary.py  batch variance at each degree and each degree against the reference degree
The source (probes/sources/tensor_parallel.py) ties them to the probe loop.
"""
