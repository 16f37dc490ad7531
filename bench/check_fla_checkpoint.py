#!/usr/bin/env python3
"""GPU check: a checkpoint written by flash-linear-attention's (FLA's) GLAForCausalLM, loaded with
flashgla.models.GLAForCausalLM.from_pretrained, gives FLA's logits.

    python bench/check_fla_checkpoint.py    # needs a GPU, FLA (fla-core + flash-linear-attention), transformers

Builds FLA's GLAForCausalLM from a small config with the options flashgla maps (short convolutions, the
output gate fused into the norm, grouped heads, clamp_min, a hybrid softmax-attention layer with grouped KV
heads and its own rope_theta, tied embeddings), randomizes every weight (norm weights too, so a swapped
or misnamed weight shows), saves it with FLA's save_pretrained (safetensors, and pytorch_model.bin),
loads it with flashgla, and compares the logits on CUDA (T = 256: FLA's chunked kernels, and T = 40: FLA's
fused recurrent path) against FLA's fp32 logits:
- fp32: flashgla's fp32 logits within 2e-3 relative RMS of FLA's fp32 logits;
- bf16: bf16 rounds every weight and activation, so no bf16 model can be much closer to the fp32 logits than
  FLA's own bf16 model is. The check measures both distances, flashgla bf16 vs FLA fp32 and FLA bf16 vs
  FLA fp32, prints both and their ratio, and passes when flashgla's is at most BF16_FACTOR (1.1) times FLA's.
Also a greedy generation per dtype against FLA's argmax in the same dtype. Prints PASS/FAIL per line; exits
non-zero on a FAIL. FLA's attention layer needs flash-attn: without it the hybrid layer is left out
(and said so). Finally it checks that FLA ("gla") and flashgla ("flashgla_gla") coexist in transformers'
AutoModelForCausalLM.
"""

import argparse
import sys
import tempfile

import torch

FP32_TOLERANCE = 2e-3  # relative RMS error of flashgla's fp32 logits against FLA's fp32 logits
# bf16: flashgla's distance to FLA's fp32 logits may be at most this times FLA's own bf16 distance to them.
BF16_FACTOR = 1.1


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


def compare(hybrid, directory, failures):
    from flashgla.models import GLAForCausalLM
    fla = {dtype: fla_model(hybrid).to(device="cuda", dtype=dtype).eval()
           for dtype in (torch.float32, torch.bfloat16)}
    ours = {dtype: GLAForCausalLM.from_pretrained(directory, map_location="cuda", dtype=dtype).eval()
            for dtype in (torch.float32, torch.bfloat16)}
    for seq_len in (256, 40):
        ids = torch.randint(0, 1000, (2, seq_len), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        with torch.no_grad():
            ref = fla[torch.float32](input_ids=ids).logits.float()  # the reference: FLA in fp32
            fla_bf16 = fla[torch.bfloat16](input_ids=ids).logits.float()
            ours_fp32 = ours[torch.float32](ids).logits.float()
            ours_bf16 = ours[torch.bfloat16](ids).logits.float()
        scale = f"(|logit| max {ref.abs().max().item():.2f})"

        rel, worst = rel_rms(ours_fp32, ref)
        ok = rel <= FP32_TOLERANCE and bool(torch.isfinite(ours_fp32).all())
        print(f"  fp32 T={seq_len:4}: flashgla vs FLA fp32: rel RMS {rel:.2e}, max |diff| {worst:.3e} {scale}, "
              f"bound {FP32_TOLERANCE:.0e} {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{directory} fp32 T={seq_len}")

        ours_rel, ours_worst = rel_rms(ours_bf16, ref)
        fla_rel, fla_worst = rel_rms(fla_bf16, ref)
        ratio = ours_rel / fla_rel if fla_rel > 0 else float("inf")
        ok = ours_rel <= BF16_FACTOR * fla_rel and bool(torch.isfinite(ours_bf16).all())
        print(f"  bf16 T={seq_len:4}: flashgla bf16 vs FLA fp32: rel RMS {ours_rel:.2e} (max |diff| {ours_worst:.3e}); "
              f"FLA bf16 vs FLA fp32: rel RMS {fla_rel:.2e} (max |diff| {fla_worst:.3e}); ratio {ratio:.3f}, bound "
              f"{BF16_FACTOR} {scale} {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{directory} bf16 T={seq_len}")
    for dtype in (torch.bfloat16, torch.float32):
        # Generation: greedy continuation of ours against the argmax of FLA's full forward pass.
        prompt = torch.randint(0, 1000, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
        tokens = ours[dtype].generate(prompt, 16)
        with torch.no_grad():
            ref = fla[dtype](input_ids=tokens).logits.float()[:, 31:-1]
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
        compare(hybrid, directory, failures)
    if not coexistence(directory):
        failures.append("coexistence")
    print("PASS" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
