"""The transformers integration (flashgla.models.hf): save_pretrained / AutoModelForCausalLM.from_pretrained
round trips in safetensors, generate() against flashgla's own generate and a full forward, sampling
options, dtype, the GLACache, and that `import flashgla` registers the model type without importing
transformers itself. CPU, tiny sizes."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install flashgla[hf])")
pytest.importorskip("safetensors", reason="safetensors is not installed (pip install flashgla[hf])")

import flashgla  # noqa: E402,F401  (registers the model type)
from flashgla.models import GLAConfig, GLAForCausalLM  # noqa: E402
from flashgla.models.hf import FlashGLAConfig, FlashGLAForCausalLM, GLACache  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


HYBRID = dict(attn_layers=[1], attn_num_heads=4, attn_num_kv_heads=2)


def tiny_hf(seed=0, **options):
    torch.manual_seed(seed)
    values = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_heads=2, eos_token_id=None,
                  bos_token_id=None, pad_token_id=None)
    values.update(options)
    model = FlashGLAForCausalLM(FlashGLAConfig(**values)).eval()
    with torch.no_grad():  # norms and all: every weight random, so a weight loaded wrong shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def dtype_kw(dtype):
    return {"dtype": dtype} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dtype}


@pytest.mark.parametrize("options", [dict(), dict(use_short_conv=True, tie_word_embeddings=True, **HYBRID)])
def test_save_pretrained_and_automodel_round_trip(tmp_path, options):
    model = tiny_hf(seed=1, **options)
    model.save_pretrained(str(tmp_path))
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), **dtype_kw(torch.float32)).eval()
    assert type(loaded) is FlashGLAForCausalLM and loaded.config.to_core() == model.config.to_core()
    assert type(transformers.AutoConfig.from_pretrained(str(tmp_path))) is FlashGLAConfig
    if options.get("tie_word_embeddings"):
        assert loaded.model.lm_head.weight.data_ptr() == loaded.model.embeddings.weight.data_ptr()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.full_like(ref, float("nan"))
        out.copy_(loaded(ids).logits)
    assert torch.equal(out, ref)
    # flashgla's own loader reads the same directory
    core = GLAForCausalLM.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        assert torch.equal(core(ids).logits, ref)


def test_dtype_and_labels(tmp_path):
    model = tiny_hf(seed=3)
    model.save_pretrained(str(tmp_path))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), **dtype_kw(torch.bfloat16))
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids, labels=ids)
        out = loaded(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and rel_error(out.logits, ref.logits) < 3e-2
    assert abs(out.loss.item() - ref.loss.item()) < 3e-2 * ref.loss.item()


@pytest.mark.parametrize("options", [dict(), dict(use_short_conv=True, **HYBRID)])
def test_greedy_generate_matches_flashgla_generate_and_the_argmax(options):
    model = tiny_hf(seed=5, **options)
    prompt = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(6))
    lengths = []  # the prompt once, then one token per step: the cache is used
    hook = model.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    hook.remove()
    assert lengths == [6] + [1] * 7
    assert out.shape == (3, 14) and torch.equal(out[:, :6], prompt)
    assert torch.equal(out, model.model.generate(prompt, 8))
    with torch.no_grad():
        logits = model(out, use_cache=False).logits
    assert torch.equal(logits[:, 5:-1].argmax(-1), out[:, 6:])


@pytest.mark.parametrize("options", [dict(use_short_conv=True), dict(use_short_conv=True, **HYBRID)])
def test_generate_with_left_padding_matches_one_prompt_at_a_time(options):
    model = tiny_hf(seed=7, **options)
    prompts = [torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 3)]
    ids = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, 5 - len(prompt):], mask[b, 5 - len(prompt):] = prompt, 1
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                             pad_token_id=0)
    for b, prompt in enumerate(prompts):
        alone = model.generate(prompt.unsqueeze(0), max_new_tokens=6, do_sample=False, min_new_tokens=6)
        assert torch.equal(batched[b, 5:], alone[0, len(prompt):])


def test_sampling_options_and_cache():
    model = tiny_hf(seed=8, **HYBRID)
    prompt = torch.randint(0, 40, (2, 4), generator=torch.Generator().manual_seed(9))
    greedy = model.generate(prompt, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert torch.equal(model.generate(prompt, max_new_tokens=5, do_sample=True, top_k=1, min_new_tokens=5), greedy)
    runs = []
    for _ in range(2):
        torch.manual_seed(10)
        runs.append(model.generate(prompt, max_new_tokens=5, do_sample=True, temperature=1.5, top_p=0.9,
                                   repetition_penalty=1.2, min_new_tokens=5))
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (2, 9)
    several = model.generate(prompt, max_new_tokens=3, do_sample=True, num_return_sequences=3, min_new_tokens=3)
    assert several.shape == (6, 7)
    out = model.generate(prompt, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                         output_scores=True, min_new_tokens=3)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    assert isinstance(cache, GLACache) and cache.get_seq_length() == 6
    assert len(out.scores) == 3
    beams = model.generate(prompt, max_new_tokens=4, num_beams=2, do_sample=False, min_new_tokens=4)
    assert beams.shape == (2, 8)


def test_import_flashgla_registers_without_importing_transformers(tmp_path):
    model = tiny_hf(seed=11)
    model.save_pretrained(str(tmp_path))
    script = (
        "import sys, flashgla\n"
        "assert 'transformers' not in sys.modules, 'import flashgla imported transformers'\n"
        "import transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "print(type(m).__name__)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "flashgla: could not register" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "FlashGLAForCausalLM"


def test_bad_config_raises_value_error():
    with pytest.raises(ValueError, match="attn_layers"):
        FlashGLAConfig(num_hidden_layers=2, attn_layers=[3])
    assert GLAConfig.from_dict(FlashGLAConfig(hidden_size=64, num_heads=4).to_core().to_dict()).hidden_size == 64


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not flashgla.cuda_available(), reason="needs a CUDA build of flashgla and a GPU"))])
def test_device_map_and_generate_on_the_device(tmp_path, device):
    pytest.importorskip("accelerate", reason="transformers needs accelerate for device_map")
    model = tiny_hf(seed=12, use_short_conv=True, tie_word_embeddings=True, **HYBRID)
    model.save_pretrained(str(tmp_path))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), device_map=device,
                                                               **dtype_kw(torch.bfloat16))
    assert all(p.device.type == device and p.dtype == torch.bfloat16 for p in loaded.parameters())
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(13)).to(device)
    out = loaded.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert out.device.type == device and out.shape == (2, 11)
    assert torch.equal(out, loaded.model.generate(prompt, 6))  # both graphs on CUDA, both eager on the CPU


@pytest.mark.parametrize("options", [dict(use_short_conv=True), dict(use_short_conv=True, **HYBRID)])
def test_generate_through_the_static_decode_step(options):
    """cuda_graph=True on the CPU: transformers' generate() decodes through the same static-shape step that
    is captured in a CUDA graph on a GPU (static KV caches of generate's max_length); the tokens are those
    of ordinary decoding, for greedy, sampled and beam-search generation."""
    model = tiny_hf(seed=14, **options)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(15))
    runs = {}
    for graph in (False, True):
        model.cuda_graph = graph
        lengths = []
        hook = model.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
        greedy = model.generate(prompt, max_new_tokens=7, do_sample=False, min_new_tokens=7)
        hook.remove()
        torch.manual_seed(16)
        sampled = model.generate(prompt, max_new_tokens=7, do_sample=True, top_k=8, min_new_tokens=7)
        beams = model.generate(prompt, max_new_tokens=5, num_beams=3, do_sample=False, min_new_tokens=5)
        runs[graph] = (greedy, sampled, beams)
        assert lengths == [5] + [1] * 6
    model.cuda_graph = None
    for eager, static in zip(runs[False], runs[True]):
        assert torch.equal(eager, static)
    assert torch.equal(runs[True][0], model.model.generate(prompt, 7, cuda_graph=False))


def test_static_cache_continues_past_its_capacity():
    """A cache filled by generate() (static KV caches of its length) continues eagerly afterwards."""
    model = tiny_hf(seed=17, **HYBRID)
    model.cuda_graph = True
    prompt = torch.randint(0, 40, (1, 4), generator=torch.Generator().manual_seed(18))
    out = model.generate(prompt, max_new_tokens=5, do_sample=False, min_new_tokens=5, return_dict_in_generate=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    assert cache.decoder is not None and cache.get_seq_length() == 8
    ids = torch.cat([out.sequences, torch.tensor([[3]])], 1)  # 10 tokens: one more than generate's length 9
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        ninth = model(ids[:, 8:9], past_key_values=cache, use_cache=True).logits[:, -1]  # fits: static step
        assert cache.decoder is not None
        tenth = model(ids[:, 9:10], past_key_values=cache, use_cache=True).logits[:, -1]  # beyond: eager
    assert cache.decoder is None
    assert rel_error(ninth, full[:, 8]) < 1e-5 and rel_error(tenth, full[:, 9]) < 1e-5
    model.cuda_graph = None
