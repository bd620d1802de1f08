"""``python -m flashsampling_inductor.serve``: the models transformers' server loads are enabled."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
model_manager = pytest.importorskip("transformers.cli.serving.model_manager")

from flashsampling_inductor import hf, serve  # noqa: E402

from .hf_models import tiny_model  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)  # save_pretrained records the architecture
    return str(tmp_path)


def test_the_servers_models_are_enabled(checkpoint, monkeypatch):
    # install() patches the class; monkeypatch puts transformers' own loader back afterwards.
    manager_class = model_manager.ModelManager
    monkeypatch.setattr(manager_class, "_load_model", manager_class._load_model)
    monkeypatch.setattr(model_manager.ModelManager, "_load_processor", lambda *a, **k: None)
    serve.install()
    serve.install()  # idempotent: one wrapper
    manager = model_manager.ModelManager(dtype="float32")
    manager.device = None  # no device_map, which needs accelerate: the CPU
    model, _ = manager.load_model_and_processor(checkpoint)
    assert vars(model)["generate"].func is hf._generate
    assert vars(model)["init_continuous_batching"].func is hf._init_continuous_batching
    assert model_manager.ModelManager._load_model.__wrapped__.__name__ == "_load_model"


def test_help_lists_transformers_serve_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich cuts option names to the terminal's width
    with pytest.raises(SystemExit) as exit:
        serve.main(["--help"])
    assert exit.value.code == 0
    printed = capsys.readouterr()
    assert "--continuous-batching" in printed.out + printed.err
