"""The GLA causal LM (flashgla.models): cached generation reproduces a full forward pass, padded =
packed = separate sequences, gradients reach every parameter, a short CPU training run lowers the
loss, save/load, sampling options and bad configurations. Tiny sizes: CPU."""

import pytest

torch = pytest.importorskip("torch")

from flashgla.models import GLAConfig, GLAForCausalLM  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The matrices here are tiny: one torch thread is fastest, and stays fast on a busy machine
    (waking a second thread for each small product can cost milliseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def tiny(seed=0, dtype=torch.float64, **options):
    torch.manual_seed(seed)
    values = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_heads=2)
    values.update(options)
    return GLAForCausalLM(GLAConfig(**values)).to(dtype).eval()


HYBRID = dict(attn_layers=[1], attn_num_heads=4, attn_num_kv_heads=2)


@pytest.mark.parametrize("options", [dict(), dict(use_short_conv=True, num_kv_heads=1), HYBRID])
def test_cached_generation_reproduces_the_full_forward(options):
    model = tiny(**options)
    torch.manual_seed(1)
    ids = torch.randint(0, 40, (2, 23))
    with torch.no_grad():
        full = model(ids).logits
        prefill = model(ids[:, :9], use_cache=True)
        pieces, cache = [prefill.logits], prefill.cache
        for t in range(9, 23):  # decode: one token at a time through the cache
            step = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            pieces.append(step.logits)
    assert len(cache) == 23
    assert rel_error(torch.cat(pieces, 1), full) < 1e-6  # GLA states are fp32


@pytest.mark.parametrize("options", [dict(), HYBRID])
def test_greedy_generation_continues_with_the_argmax_of_a_full_forward(options):
    model = tiny(seed=2, **options)
    prompt = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(3))
    out = model.generate(prompt, max_new_tokens=8)
    assert out.shape == (2, 14) and torch.equal(out[:, :6], prompt)
    with torch.no_grad():
        logits = model(out).logits
    assert torch.equal(logits[:, 5:-1].argmax(-1), out[:, 6:])


@pytest.mark.parametrize("options", [dict(use_short_conv=True), HYBRID])
def test_padded_batch_equals_packed_batch_equals_each_sequence(options):
    model = tiny(seed=4, **options)
    torch.manual_seed(5)
    lengths = [10, 4, 7]
    T = 10
    ids = torch.randint(0, 40, (3, T))
    mask = torch.zeros(3, T, dtype=torch.long)
    mask[0] = 1
    mask[1, T - 4:] = 1  # left padding
    mask[2, :7] = 1      # right padding
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        cu_seqlens = torch.tensor([0, 10, 14, 21], dtype=torch.int32)
        packed = model(torch.cat([ids[b, mask[b].bool()] for b in range(3)]).unsqueeze(0),
                       cu_seqlens=cu_seqlens).logits
        for b in range(3):
            alone = model(ids[b:b + 1, mask[b].bool()]).logits[0]
            assert rel_error(padded[b, mask[b].bool()], alone) < 1e-12
            assert rel_error(packed[0, cu_seqlens[b]:cu_seqlens[b + 1]], alone) < 1e-12
    assert torch.all(padded[mask == 0] == 0)


def test_batched_generation_of_left_padded_prompts_matches_one_at_a_time():
    for options in (dict(), HYBRID):
        model = tiny(seed=6, **options)
        prompts = [torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 3)]
        ids = torch.zeros(2, 5, dtype=torch.long)
        mask = torch.zeros(2, 5, dtype=torch.long)
        for b, prompt in enumerate(prompts):
            ids[b, 5 - len(prompt):], mask[b, 5 - len(prompt):] = prompt, 1
        batched = model.generate(ids, 6, attention_mask=mask)
        for b, prompt in enumerate(prompts):
            alone = model.generate(prompt.unsqueeze(0), 6)
            assert torch.equal(batched[b, 5:], alone[0, len(prompt):])


def test_sampling_options():
    model = tiny(seed=7)
    prompt = torch.randint(0, 40, (3, 4), generator=torch.Generator().manual_seed(8))
    greedy = model.generate(prompt, 5)
    assert torch.equal(model.generate(prompt, 5, do_sample=True, top_k=1), greedy)
    first = model.generate(prompt, 5, do_sample=True, temperature=2.0, generator=torch.Generator().manual_seed(9))
    again = model.generate(prompt, 5, do_sample=True, temperature=2.0, generator=torch.Generator().manual_seed(9))
    assert torch.equal(first, again)
    eos = int(greedy[0, 4])  # the first greedy token of row 0: that row stops at once
    stopped = model.generate(prompt, 5, eos_token_id=eos)
    assert stopped.shape == (3, 9) and torch.all(stopped[0, 4:] == eos)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="left"):
        model.generate(prompt, 2, attention_mask=torch.tensor([[1, 1, 1, 0]] * 3))


def test_every_parameter_receives_a_gradient():
    model = tiny(seed=10, dtype=torch.float32, use_short_conv=True, num_kv_heads=1, **HYBRID).train()
    ids = torch.randint(0, 40, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_loss_ignores_padding_and_sequence_boundaries():
    model = tiny(seed=11)
    ids = torch.randint(0, 40, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        padded = model(ids, attention_mask=mask, labels=ids).loss
        packed_ids = torch.cat([ids[0], ids[1, 3:]]).unsqueeze(0)
        packed = model(packed_ids, cu_seqlens=torch.tensor([0, 8, 13]), labels=packed_ids).loss
        logits = [model(ids[:1]).logits[0], model(ids[1:, 3:]).logits[0]]
    targets = [ids[0, 1:], ids[1, 4:]]
    reference = torch.nn.functional.cross_entropy(torch.cat([l[:-1] for l in logits]), torch.cat(targets))
    assert abs(padded.item() - reference.item()) < 1e-10
    assert abs(packed.item() - reference.item()) < 1e-10


def test_short_training_run_lowers_the_loss():
    model = tiny(seed=12, dtype=torch.float32, vocab_size=16, num_hidden_layers=2).train()
    generator = torch.Generator().manual_seed(13)
    # A learnable language: each token is the previous one plus 1 (mod 16), from a random start.
    starts = torch.randint(0, 16, (64, 1), generator=generator)
    data = (starts + torch.arange(24)) % 16
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        batch = data[(step * 8) % 64:(step * 8) % 64 + 8]
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 2.0  # about log(16) at the start
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses


def test_save_and_load(tmp_path):
    model = tiny(seed=14, use_short_conv=True, **HYBRID)
    model.save_pretrained(str(tmp_path))
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.pt").exists()
    loaded = GLAForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    assert loaded.config == model.config
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_attn_deterministic_reaches_the_attention_layers():
    model = tiny(attn_deterministic=True, **HYBRID)
    assert [getattr(block.attn, "deterministic", None) for block in model.layers] == [None, True, None]
    ids = torch.randint(0, 40, (2, 9))
    model(ids).logits.sum().backward()  # the flag reaches flash_attention's backward (CPU: deterministic anyway)
    with pytest.raises(TypeError, match="attn_deterministic"):
        tiny(attn_deterministic=1, **HYBRID)


@pytest.mark.parametrize("options, message", [
    (dict(attn_layers=[5]), "attn_layers"),
    (dict(attn_layers=[1, 1]), "repeated"),
    (dict(hidden_size=30, num_heads=4), "num_heads"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(attn_layers=[0], attn_num_heads=5), "num_heads"),
    (dict(attn_layers=[0], attn_backend="xformers"), "backend"),
])
def test_bad_configurations_raise_value_errors(options, message):
    with pytest.raises(ValueError, match=message):
        tiny(**options)
    with pytest.raises(ValueError, match="unknown"):
        GLAConfig.from_dict({"hidden_size": 32, "num_layers": 2})
