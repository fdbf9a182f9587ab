"""probes/tp/local_params.py on the CPU: 2 gloo ranks, a tiny Qwen3 loaded with transformers' TP plan.

Inside local_linear_params the TP linears and the vocab-parallel embedding hold plain local shards and
run without transformers' TP wrappers (the row-parallel ones as a subclass of ours, the embedding with a
forward of ours, both all-reducing; Qwen3's q_norm / k_norm, whose wrapper only hooks gradients, run
their class's forward); the logits must be the same bits as with their DTensors and wrappers (the same
local kernels and collective run), eagerly and compiled, and the DTensors and wrappers come back after.
The control: the swap really happened (a count > 0 and no DTensor weight on any linear inside), so an
equality of two unchanged models cannot pass for it.
"""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, model_dir: str, results):
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from nondet.probes.tp import local_params
    from nondet.probes.tp.load import tp_kwargs
    from nondet.probes.tp.local_params import local_linear_params

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **tp_kwargs(2)).eval()
    # ids on both sides of the vocabulary's split (512 tokens: rank 1's slice begins at 256), its edges too
    ids = torch.tensor([[3, 17, 42, 9, 100, 7], [0, 255, 256, 300, 511, 10]])
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    dtensors_before = sum(isinstance(m.weight, DTensor) for m in linears)
    wrappers_before = [m.__dict__.get("forward") for m in linears]
    # Qwen3's q_norm / k_norm: transformers' gradient-only wrapper outside, their class's forward inside
    norms = [m for name, m in model.named_modules() if name.endswith(("q_norm", "k_norm"))]
    norm_wrappers = [m.__dict__.get("forward") for m in norms]
    embedding_before = model.get_input_embeddings().weight.placements
    with torch.inference_mode():
        plain = model(ids).logits
        compiled = torch.compile(model, backend="inductor", fullgraph=False)
        with local_linear_params(model) as swapped:
            dtensors_inside = sum(isinstance(m.weight, DTensor) for m in linears)
            # colwise: nn.Linear's own forward; rowwise: our subclass's (its all-reduce); the lm_head keeps its wrapper
            forwards = [getattr(m.__dict__.get("forward"), "__module__", type(m).__module__) for m in linears]
            norms_wrapped_inside = sum("forward" in m.__dict__ for m in norms)
            local = model(ids).logits
            local_compiled = compiled(ids).logits
            groups_inside = len(local_params._GROUPS)  # the row-parallel linears' group, by name
        dtensors_after = sum(isinstance(m.weight, DTensor) for m in linears)
        wrappers_back = all(m.__dict__.get("forward") is w for m, w in zip(linears + norms,
                                                                          wrappers_before + norm_wrappers))
        classes_back = {type(m).__name__ for m in linears}
        names_left = sum("nondet_tp_group_name" in m.__dict__ for m in linears) + len(local_params._GROUPS)
        reference_compiled = compiled(ids).logits
    if rank == 0:
        results.put({"embedding_sharded": str(embedding_before), "swapped": swapped, "dtensors_inside": dtensors_inside, "dtensors_after": dtensors_after,
                     "dtensors_before": dtensors_before, "wrappers_back": wrappers_back, "classes_back": classes_back,
                     "groups_inside": groups_inside, "names_left": names_left,
                     "norms_wrapped_before": sum(w is not None for w in norm_wrappers),
                     "norms_wrapped_inside": norms_wrapped_inside,
                     "forwards": {f: forwards.count(f) for f in set(forwards)}, "eager_equal": bool(torch.equal(plain, local)),
                     "compiled_equal": bool(torch.equal(reference_compiled, local_compiled))})
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_local_shards_give_the_dtensor_models_bits_and_the_dtensors_come_back(tiny_model_dir):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_rank, args=(_port(), str(tiny_model_dir), results), nprocs=2, join=True,
                       start_method="spawn")
    r = results.get(timeout=5)
    assert r["swapped"] > 0 and r["dtensors_inside"] == 0, r  # control: the swap happened
    assert r["dtensors_after"] == r["dtensors_before"] > 0 and r["wrappers_back"], r
    # 2 layers: q, k, v, gate, up nn.Linear's forward (10), o_proj and down_proj our row-parallel subclass's
    # (4), the lm_head transformers' wrapper (1); the vocab-parallel embedding ours (1: a lookup in this
    # rank's slice, then the all-reduce)
    assert r["embedding_sharded"] == "(Shard(dim=0),)", r
    assert r["forwards"] == {"torch.nn.modules.linear": 10, "nondet.probes.tp.local_params": 5,
                             "transformers.distributed.tensor_parallel": 1}, r
    assert r["classes_back"] == {"Linear", "Embedding"}, r
    assert r["groups_inside"] == 1 and r["names_left"] == 0, r  # one TP group registered, and unregistered after
    # the 4 norms of 2 layers wrapped by the TP plan (the control: a wrapper to drop), none inside
    assert r["norms_wrapped_before"] == 4 and r["norms_wrapped_inside"] == 0, r
    assert r["eager_equal"] and r["compiled_equal"], r
