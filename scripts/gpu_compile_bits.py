"""Where the compiled mode loses batch invariance: row 0 alone vs in a batch of 8, per compile setting.

    python3 scripts/gpu_compile_bits.py

A random Qwen3 (hidden 1024, 8 layers, bf16 and fp32) prefill + one decode step through the model's
forward, under batch_invariant(model, traceable=True): eager; torch.compile with the aot_eager backend
(the traced graph run on eager kernels); Inductor; Inductor without comprehensive padding; Inductor
emulating eager's precision casts. Prints, per setting, whether row 0 is bitwise equal alone and in
the batch, and whether it equals the eager mode's.
"""

import time

import torch


def model_and_ids(dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=4096, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, pad_token_id=0)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to("cuda", dtype).eval()
    ids = torch.randint(3, 4096, (8, 24), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    return model, ids


def logits(forward, ids):
    return forward(ids).logits[0].float()


def main() -> None:
    import torch._inductor.config as inductor

    from nondet.kernels import batch_invariant

    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    settings = {
        "eager": lambda m: m.forward,
        "aot_eager": lambda m: torch.compile(m.forward, backend="aot_eager", dynamic=False),
        "inductor": lambda m: torch.compile(m.forward, dynamic=False),
        "inductor, no padding": lambda m: torch.compile(
            m.forward, dynamic=False, options={"comprehensive_padding": False, "shape_padding": False}),
        "inductor, emulate casts": lambda m: torch.compile(
            m.forward, dynamic=False, options={"emulate_precision_casts": True}),
    }
    print("| dtype | setting | row 0 alone == in batch of 8 | == eager mode (alone) | max diff vs eager |")
    print("| --- | --- | --- | --- | ---: |")
    for dtype in (torch.float32, torch.bfloat16):
        model, ids = model_and_ids(dtype)
        with torch.no_grad(), batch_invariant(model=model, traceable=True):
            reference = logits(model.forward, ids[:1])
            for name, make in settings.items():
                torch._dynamo.reset()
                try:
                    forward = make(model)
                    alone, batched = logits(forward, ids[:1]), logits(forward, ids)
                    print(f"| {str(dtype)[6:]} | {name} | {torch.equal(alone, batched)} | "
                          f"{torch.equal(alone, reference)} | {(alone - reference).abs().max().item():.3g} |",
                          flush=True)
                except Exception as exc:  # noqa: BLE001 - one setting's failure must not hide the others
                    print(f"| {str(dtype)[6:]} | {name} | FAILED {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:100]} | | |", flush=True)
    del inductor


if __name__ == "__main__":
    main()
