#!/usr/bin/env python3
"""GPU check: a checkpoint written by flash-linear-attention's (FLA's) GLAForCausalLM, loaded with
flashgla.models.GLAForCausalLM.from_pretrained, gives FLA's logits.

    python bench/check_fla_checkpoint.py    # needs a GPU, FLA (fla-core + flash-linear-attention), transformers

Builds FLA's GLAForCausalLM from a small config with the options flashgla maps (short convolutions, the
output gate fused into the norm, grouped heads, clamp_min, a hybrid softmax-attention layer with grouped KV
heads and its own rope_theta, tied embeddings), randomizes every weight (norm weights too, so a swapped
or misnamed weight shows), saves it with FLA's save_pretrained (safetensors, and pytorch_model.bin),
loads it with flashgla, and compares the logits in bf16 on CUDA (T = 256: FLA's chunked kernels, and
T = 40: FLA's fused recurrent path), and in fp32. Prints the relative RMS and max errors and PASS/FAIL;
exits non-zero on a FAIL. FLA's attention layer needs flash-attn: without it the hybrid layer is left out
(and said so). Finally it checks that FLA ("gla") and flashgla ("flashgla_gla") coexist in transformers'
AutoModelForCausalLM.
"""

import argparse
import sys
import tempfile

import torch

TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 2e-3}  # relative RMS error of the logits


def rel_rms(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item(), (out - ref).abs().max().item()


def fla_model(hybrid):
    from fla.models import GLAConfig, GLAForCausalLM
    options = dict(vocab_size=1000, hidden_size=512, num_hidden_layers=4, num_heads=4, num_kv_heads=2,
                   expand_k=0.5, expand_v=1.0, use_short_conv=True, conv_size=4, use_output_gate=True,
                   clamp_min=-2.0, fuse_norm=True, tie_word_embeddings=True, attn_mode="chunk", norm_eps=1e-6)
    if hybrid:
        options["attn"] = {"layers": [1], "num_heads": 8, "num_kv_heads": 4, "rope_theta": 50000.0}
    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(**options))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "gk_proj.1.bias" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


def compare(fla, directory, dtype, failures):
    from flashgla.models import GLAForCausalLM
    ours = GLAForCausalLM.from_pretrained(directory, map_location="cuda", dtype=dtype).eval()
    fla = fla.to(device="cuda", dtype=dtype).eval()
    for seq_len in (256, 40):
        ids = torch.randint(0, 1000, (2, seq_len), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        with torch.no_grad():
            ref = fla(input_ids=ids).logits.float()
            out = ours(ids).logits.float()
        rel, worst = rel_rms(out, ref)
        ok = rel <= TOLERANCE[dtype] and bool(torch.isfinite(out).all())
        print(f"  {str(dtype):15} T={seq_len:4}: rel RMS error {rel:.2e}, max |diff| {worst:.3e} "
              f"(|logit| max {ref.abs().max().item():.2f}) {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{directory} {dtype} T={seq_len}")
    # Generation: greedy continuation of ours against the argmax of FLA's full forward pass.
    prompt = torch.randint(0, 1000, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    tokens = ours.generate(prompt, 16)
    with torch.no_grad():
        ref = fla(input_ids=tokens).logits.float()[:, 31:-1]
    picked = ref.gather(-1, tokens[:, 32:].unsqueeze(-1)).squeeze(-1)
    margin = (ref.max(-1).values - picked).max().item()
    ok = margin <= (0.1 if dtype == torch.bfloat16 else 1e-2)
    print(f"  {str(dtype):15} generate: our greedy tokens are FLA's argmax up to {margin:.3e} in logit "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"{directory} {dtype} generate")


def coexistence(directory):
    import flashgla  # noqa: F401  (registers flashgla_gla)
    import transformers
    from flashgla.models.hf import FlashGLAConfig, FlashGLAForCausalLM
    fla = transformers.AutoModelForCausalLM.from_pretrained(directory)
    ours_dir = tempfile.mkdtemp()
    FlashGLAForCausalLM(FlashGLAConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2)).save_pretrained(ours_dir)
    ours = transformers.AutoModelForCausalLM.from_pretrained(ours_dir)
    print(f"  transformers AutoModelForCausalLM: 'gla' -> {type(fla).__module__}.{type(fla).__name__}, "
          f"'flashgla_gla' -> {type(ours).__module__}.{type(ours).__name__}")
    return type(ours) is FlashGLAForCausalLM and type(fla).__module__.startswith("fla.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("check_fla_checkpoint: needs a GPU (FLA's kernels are Triton)")
    try:
        import fla
    except ImportError as error:
        raise SystemExit(f"check_fla_checkpoint: FLA is not installed ({error}); install the fla-core and "
                         "flash-linear-attention wheels")
    print(f"FLA {getattr(fla, '__version__', '?')}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    hybrid = True
    try:
        model = fla_model(hybrid=True)
    except ImportError as error:  # FLA's softmax attention layer needs flash-attn
        print(f"NOTE: hybrid attention layer left out: {error}")
        hybrid, model = False, fla_model(hybrid=False)
    failures = []
    for safe in (True, False):
        directory = tempfile.mkdtemp()
        if safe:
            model.save_pretrained(directory)
        else:  # the pytorch_model.bin layout of older transformers (recent ones write safetensors only)
            model.config.save_pretrained(directory)
            torch.save({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"},
                       f"{directory}/pytorch_model.bin")
        print(f"FLA checkpoint ({'safetensors' if safe else 'pytorch_model.bin'}, hybrid={hybrid}) in {directory}")
        for dtype in (torch.bfloat16, torch.float32):
            compare(fla_model(hybrid), directory, dtype, failures)
    if not coexistence(directory):
        failures.append("coexistence")
    print("PASS" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
