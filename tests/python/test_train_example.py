"""examples/train_gla_lm.py and examples/sample.py as a user meets them: a run folder that holds a run
is never replaced without --overwrite, --resume without a checkpoint is an error naming the folder,
--steps at or below the steps done says there is nothing to do (exit 0), the plain and the
context-parallel path give the same loss on the same windows, and every flag has help text."""

import argparse
import importlib.util
import pathlib
import types

import pytest
import torch

from spawn_utils import run_distributed
from testing_utils import assert_close

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = load_example("train_gla_lm")

# A run of one step of a one-layer model of width 16: a few seconds on a busy CPU.
TINY = ["--steps", "1", "--eval-every", "1", "--batch-size", "2", "--seq-len", "16", "--hidden-size", "16",
        "--num-heads", "1", "--num-hidden-layers", "1", "--eval-batches", "1", "--sample-tokens", "2",
        "--threads", "1"]


def run_example(out, *extra):
    train.main(["--out", str(out), *TINY, *extra])


def exit_message(out, *extra):
    with pytest.raises(SystemExit) as error:
        run_example(out, *extra)
    return str(error.value.code)


def test_resume_without_a_checkpoint_names_the_folder(tmp_path):
    missing = tmp_path / "never-trained"
    message = exit_message(missing, "--resume")
    assert message.startswith(f"--resume: no checkpoint to continue in {missing}: it does not exist; expected "
                              f"{missing / 'checkpoint'}"), message
    assert "Drop --resume to start a new run" in message
    assert not missing.exists(), "a refused --resume must not create the folder"
    (tmp_path / "empty").mkdir()
    assert "it holds no run" in exit_message(tmp_path / "empty", "--resume")


def test_a_folder_holding_a_run_is_not_replaced_without_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    run_example(out)
    before = (out / "losses.json").read_text()
    message = exit_message(out)
    assert message == (f"--out {out}: this folder holds a run (config.json, model.pt, losses.json, "
                       f"checkpoint/.metadata); pass --resume to continue it, --overwrite to replace it, "
                       f"or another --out"), message
    assert (out / "losses.json").read_text() == before, "the refused run touched the folder"
    run_example(out, "--overwrite", "--seed", "1")
    assert (out / "losses.json").read_text() != before, "--overwrite did not start a new run"


def test_nothing_left_to_do_says_so_and_exits_0(tmp_path, capsys):
    out = tmp_path / "run"
    run_example(out)
    capsys.readouterr()
    for steps in ("1", "0"):
        if steps == "0":  # not a number of steps at all: refused by the parser
            with pytest.raises(SystemExit) as error:
                run_example(out, "--resume", "--steps", steps)
            assert error.value.code == 2
            assert "--steps 0: give at least 1" in capsys.readouterr().err
            continue
        run_example(out, "--resume", "--steps", steps)  # returns: exit status 0
        printed = capsys.readouterr().out
        assert printed.strip() == (f"nothing to do: the run in {out} has done 1 steps and --steps is 1; "
                                   f"pass a larger --steps to train on"), printed


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        run_example(tmp_path / "run", "--resume", "--overwrite")
    assert error.value.code == 2
    assert "--resume and --overwrite: give one" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["train_gla_lm", "sample"])
def test_every_flag_has_help_text(name):
    parser = load_example(name).build_parser()
    bare = [action.option_strings or [action.dest] for action in parser._actions
            if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert not bare, f"examples/{name}.py: flags without help text: {bare}"


# ---- the plain and the context-parallel path agree ----------------------------------------------------------

SEQ_LEN, BATCH = 17, 3  # packed under CP: 3 windows of 18 bytes, 27 per rank, the second across the edge


def _tiny_model():
    from flashgla.models import GLAConfig, GLAForCausalLM

    torch.manual_seed(3)
    config = GLAConfig(vocab_size=256, hidden_size=16, num_hidden_layers=2, num_heads=2, use_short_conv=True)
    return GLAForCausalLM(config).double()


def _windows():
    return torch.randint(0, 256, (BATCH, SEQ_LEN + 1), generator=torch.Generator().manual_seed(11))


def _cp_loss_worker(rank, world_size, expected):
    import torch.distributed as dist

    ranks = types.SimpleNamespace(device=torch.device("cpu"), cp=world_size, cp_rank=rank,
                                  cp_group=dist.group.WORLD)
    args = types.SimpleNamespace(batch_size=BATCH, seq_len=SEQ_LEN)
    loss = train.Step(_tiny_model(), ranks, args).loss(_windows())
    assert_close(loss, expected, 1e-12, f"rank {rank}: the CP path's loss against the plain path's")


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with gloo is not available")
def test_plain_and_context_parallel_losses_agree():
    ranks = types.SimpleNamespace(device=torch.device("cpu"), cp=1)
    args = types.SimpleNamespace(batch_size=BATCH, seq_len=SEQ_LEN)
    plain = train.Step(_tiny_model(), ranks, args).loss(_windows())
    windows = _windows()  # the same loss by hand: every window predicts its bytes 1..seq_len from 0..seq_len-1
    logits = _tiny_model()(windows[:, :-1]).logits
    by_hand = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))
    assert_close(plain, by_hand, 1e-12, "the plain path's loss against next-byte cross-entropy")
    run_distributed(_cp_loss_worker, 2, plain.detach(), timeout=180)
