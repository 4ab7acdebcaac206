"""Facts owned by registry entries, optional abilities checked once where a domain or verifier is
built, and the one sandbox-settings type (with the pool's refusal naming the recipe's key)."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import replace

import pytest

from postrl.abilities import Closeable, Finite, RunsCode, Stateful, check_abilities
from postrl.errors import UserError
from postrl.rewards.code_verifier import CODE_COMPONENTS, WEIGHTS
from postrl.rewards.verifiers import VERIFIERS, VerifierSettings, verifier_facts
from postrl.sandbox.runs import SandboxConfig
from postrl.sandbox.settings import SandboxSettings
from postrl.tasks.base import DOMAINS, register_domain
from postrl.tasks.catalog import make_domain
from postrl.tasks.code import CodeParams
from postrl.tasks.dataset import DatasetParams

ROW = '{"text": "Write add.", "test_list": ["assert add(1, 2) == 3"]}\n'


class Arithmetic:
    """A minimal domain: arith's problems, and whatever ability a test gives its subclass."""

    def __init__(self, params: dict, seed: int, name: str = "x"):
        self.inner = make_domain("arith", params, seed, name)
        self.name, self.levels = name, self.inner.levels

    def sample(self, rng, level=None):
        return self.inner.sample(rng, level)

    def heldout(self, n):
        return self.inner.heldout(n)

    def score(self, tasks, responses):
        return self.inner.score(tasks, responses)


@pytest.fixture
def registered():
    names = []

    def register(name: str, factory, **facts):
        register_domain(name, **facts)(factory)
        names.append(name)

    yield register
    for name in names:
        DOMAINS.remove(name)


def test_half_an_ability_is_an_error_where_the_domain_is_built(registered):
    class HalfStateful(Arithmetic):
        def load_state_dict(self, state):
            pass

    registered("half_stateful", HalfStateful)
    with pytest.raises(UserError, match=r"^domain half_stateful \(type half_stateful\) has load_state_dict but "
                                        r"not state_dict: postrl.abilities.Stateful needs both$"):
        make_domain("half_stateful")


def test_a_misspelt_ability_is_an_error_where_the_domain_is_built(registered):
    class Misspelt(Arithmetic):
        def closee(self):
            pass

    registered("misspelt", Misspelt)
    with pytest.raises(UserError, match=r"defines closee\(\): did you mean close\(\)\?"):
        make_domain("misspelt")


def test_abilities_are_what_a_domain_defines_and_near_names_that_are_not_methods_pass(registered):
    class Whole(Arithmetic):
        closed = False  # a flag, not a method: not taken for a misspelt close()

        def state_dict(self):
            return {"n": 1}

        def load_state_dict(self, state):
            pass

        def close(self):
            pass

    registered("whole", Whole)
    d = make_domain("whole")
    assert isinstance(d, Stateful) and isinstance(d, Closeable) and not isinstance(d, Finite)
    assert not isinstance(make_domain("arith"), Stateful)


def test_every_built_in_domain_and_verifier_passes_the_check(tmp_path):
    (tmp_path / "rows.jsonl").write_text(ROW)
    for name in ("arith", "chat_arith", "chat_count", "code", "sort", "mul"):
        make_domain(name).close() if name == "code" else make_domain(name)
    d = make_domain("dataset", {"path": str(tmp_path / "rows.jsonl"), "prompt": "{text}", "verifier": "code",
                                "tests": "test_list", "heldout_percent": 0, "heldout_path": str(tmp_path / "rows.jsonl")})
    assert isinstance(d, Stateful) and isinstance(d, Finite) and isinstance(d, RunsCode) and isinstance(d.verifier, RunsCode)
    check_abilities(d.verifier, "verifier code")
    d.close()


def test_verifier_facts_are_the_registrations():
    assert verifier_facts("code").components == CODE_COMPONENTS and not verifier_facts("code").needs_answer
    assert verifier_facts("python:m:f").components == ("user",) and not verifier_facts("python:m:f").needs_answer
    assert verifier_facts("rm:dir").components == ("rm",) and not verifier_facts("rm:dir").needs_answer
    assert verifier_facts("exact").components == ("correct",) and verifier_facts("exact").needs_answer
    assert verifier_facts("math").check_argument("x", "") == "this verifier takes no argument"
    assert DOMAINS.facts("dataset").uses_base_dir and DOMAINS.facts("code_retry").uses_base_dir
    assert set(DOMAINS.facts("dataset").components) == {"correct", *CODE_COMPONENTS, "user", "rm"}
    assert DOMAINS.facts("code").components == CODE_COMPONENTS


def test_a_user_verifier_without_references_needs_no_answer_column(tmp_path):
    from postrl.rewards.verifiers import AnswerVerifier, exact

    (tmp_path / "rows.jsonl").write_text('{"q": "say hi"}\n{"q": "say bye"}\n')
    params = {"path": str(tmp_path / "rows.jsonl"), "prompt": "{q}", "heldout_percent": 0,
              "heldout_path": str(tmp_path / "rows.jsonl")}
    VERIFIERS.add("no_ref", lambda arg, s: AnswerVerifier(exact, s, "none"), components=("nice",), needs_answer=False)
    VERIFIERS.add("with_ref", lambda arg, s: AnswerVerifier(exact, s, "none"))
    try:
        d = make_domain("dataset", {**params, "verifier": "no_ref"}, name="hi")
        assert d.reward_components == ("nice",) and d.train_size == 2
        with pytest.raises(UserError, match=r"^domains\.hi\.params\.answer: the verifier with_ref needs"):
            make_domain("dataset", {**params, "verifier": "with_ref"}, name="hi")
    finally:
        VERIFIERS.remove("no_ref")
        VERIFIERS.remove("with_ref")


# ---------------------------------------------------------------------------- one sandbox settings type


def test_code_domain_dataset_and_verifier_share_one_sandbox_settings_type():
    for cls in (CodeParams, DatasetParams, VerifierSettings):
        assert issubclass(cls, SandboxSettings)
    # the defaults each had before they were one type: the code domain's one-liners get 3 s
    assert CodeParams().timeout_s == 3.0 and DatasetParams().timeout_s == VerifierSettings().timeout_s == 10.0
    assert SandboxSettings().timeout_s == SandboxConfig().timeout_s
    p = CodeParams()
    assert (p.w_compiles, p.w_tests, p.penalty_timeout, p.penalty_memory, p.penalty_output) == (
        WEIGHTS.compiles, WEIGHTS.tests, WEIGHTS.timeout, WEIGHTS.memory, WEIGHTS.output)


def test_a_dataset_passes_every_sandbox_setting_to_its_code_verifier(tmp_path):
    (tmp_path / "rows.jsonl").write_text(ROW)
    d = make_domain("dataset", {"path": str(tmp_path / "rows.jsonl"), "prompt": "{text}", "verifier": "code",
                                "tests": "test_list", "heldout_percent": 0, "heldout_path": str(tmp_path / "rows.jsonl"),
                                "workers": 1, "memory_mb": 256, "max_workers": 3, "idle_shrink_s": 5.0,
                                "timeout_s": 2.5}, name="mbpp")
    assert d.sandbox_config() == SandboxConfig(workers=1, memory_mb=256, max_workers=3, idle_shrink_s=5.0,
                                               allow_unisolated_key="domains.mbpp.params.allow_unisolated")
    assert (d.verifier.limits.timeout_s, d.verifier.limits.memory_mb) == (2.5, 256)
    served = make_domain("dataset", {"path": str(tmp_path / "rows.jsonl"), "prompt": "{text}", "verifier": "code",
                                     "tests": "test_list", "heldout_percent": 0, "sandbox_url": "http://x:1",
                                     "heldout_path": str(tmp_path / "rows.jsonl")}, name="mbpp")
    assert served.sandbox_config() is None


def test_the_pools_refusal_names_the_key_that_allows_it(tmp_path):
    code = make_domain("code", {"workers": 1}, name="fix")
    code.sandbox.config = replace(code.sandbox.config, use_bwrap=False)  # as where bubblewrap is missing
    with pytest.raises(UserError, match=r"^domain fix: no namespace isolation available \(.*\); "
                                        r"turn on domains\.fix\.params\.allow_unisolated to run"):
        code.sandbox.get()
    (tmp_path / "rows.jsonl").write_text(ROW)
    data = make_domain("dataset", {"path": str(tmp_path / "rows.jsonl"), "prompt": "{text}", "verifier": "code",
                                   "tests": "test_list", "heldout_percent": 0, "workers": 1,
                                   "heldout_path": str(tmp_path / "rows.jsonl")}, name="mbpp")
    data.verifier.sandbox.config = replace(data.verifier.sandbox.config, use_bwrap=False)
    with pytest.raises(UserError, match=r"^verifier code: .*turn on domains\.mbpp\.params\.allow_unisolated to run"):
        data.verifier.backend()


def test_the_serve_commands_refusal_names_its_flag():
    from postrl.commands.sandbox import _pool

    args = Namespace(workers=1, memory_mb=512, allow_unisolated=False, timeout_s=None)
    with pytest.raises(UserError, match="turn on --allow-unisolated to run"):
        _pool(args, use_bwrap=False)
