"""Registry behaviour: in-process registration, plugins that fail, duplicate names (via real entry points)."""

import json
import sys

import pytest

import attnbench
from attnbench.contenders import registry
from attnbench.contenders.registry import RegistryError
from attnbench.runner.request import RunRequest
from attnbench.runner.sweep import plan_cases

from conftest import Shifted, attnbench_cmd, fake_distribution, run_subprocess


def test_register_rejects_a_duplicate_naming_both_sources(planted):
    class AlsoBmm(Shifted):
        name = "bmm"

    with pytest.raises(RegistryError) as caught:
        attnbench.register(AlsoBmm)
    message = str(caught.value)
    assert "'bmm' is registered twice" in message
    assert "entry point bmm = attnbench.impls.bmm:contender" in message and "register() in" in message


def test_register_as_decorator_and_unregister(planted):
    @attnbench.register
    class Planted(Shifted):
        name = "planted_decorated"

    planted.append("planted_decorated")
    assert registry.get("planted_decorated").available
    assert isinstance(registry.get("planted_decorated").contender, Planted)


def test_a_notebook_cell_run_again_replaces_its_contender_and_a_stranger_is_still_refused(planted):
    """A notebook cell that defines and registers a contender, run a second time (after an edit): the new class
    replaces the old, where it raised "registered twice"; another class of the same name is still refused."""
    planted.append("planted_cell")
    versions = []
    for version in (1, 2):

        @attnbench.register
        class Cell(Shifted):
            name = "planted_cell"
            edited = version

        versions.append(Cell)
    assert registry.get("planted_cell").contender.edited == 2
    assert isinstance(registry.get("planted_cell").contender, versions[1])

    class Stranger(Shifted):
        name = "planted_cell"

    with pytest.raises(RegistryError, match="'planted_cell' is registered twice"):
        attnbench.register(Stranger)
    assert registry.get("planted_cell").contender.edited == 2


def test_names_with_commas_are_refused():
    class Comma(Shifted):
        name = "a,b"

    with pytest.raises(RegistryError, match="not allowed"):
        attnbench.register(Comma)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(attnbench.UsageError, match="contender 'nope' is not known; known: bmm"):
        registry.get("nope")


def test_broken_plugins_are_unavailable_and_disturb_nothing(tmp_path):
    fake_distribution(
        tmp_path,
        "broken-plugins",
        {
            "broken_import": "broken_module:contender",
            "not_a_contender": "plain_module:thing",
            "wrong_name": "plain_module:contender",
        },
        {
            "broken_module": "raise ImportError('needs libfoo.so')\n",
            "plain_module": "from attnbench.impls.bmm import contender\nthing = 42\n",
        },
    )
    result = run_subprocess(*attnbench_cmd("list", "--json"), env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    by_name = {r["name"]: r for r in json.loads(result.stdout)}
    # where in the plugin's own code the import failed: the line, for the author to fix
    said = "failed to load: ImportError: needs libfoo.so (raised in <module>, broken_module.py:1)"
    assert by_name["broken_import"]["reason"] == said
    assert "expected an attnbench.Contender instance or subclass, got int" in by_name["not_a_contender"]["reason"]
    assert "differs from the contender's name 'bmm'" in by_name["wrong_name"]["reason"]
    assert not any(by_name[n]["available"] for n in ("broken_import", "not_a_contender", "wrong_name"))
    assert by_name["bmm"]["available"] and by_name["sdpa_flash"]["available"]


def test_a_plugin_shadowed_by_a_folder_of_its_name_says_where_it_resolved(tmp_path):
    """`python -m attnbench` from the folder above a plugin's project folder: the cwd comes first on sys.path and
    the plugin's name resolves to that folder, a namespace package without code (an editable install's finder,
    which runs after the path, is never asked). "module has no attribute 'contender'" alone baffled (review 1,
    finding 8): the reason names the folder."""
    site, work = tmp_path / "site", tmp_path / "work"
    fake_distribution(site, "shadowplug", {"shadowplug": "shadowplug:contender"}, {})  # its code reached otherwise
    (work / "shadowplug").mkdir(parents=True)  # the plugin's project folder: pyproject.toml, src/ …, no __init__.py
    (work / "shadowplug" / "pyproject.toml").write_text("[project]\nname = 'shadowplug'\n")
    result = run_subprocess(*attnbench_cmd("list", "--json"), env={"PYTHONPATH": str(site)}, cwd=work)
    assert result.returncode == 0, result.stderr
    reason = {r["name"]: r for r in json.loads(result.stdout)}["shadowplug"]["reason"]
    folder = (work / "shadowplug").resolve()
    assert reason.startswith(f"failed to load: module 'shadowplug' resolved to a folder without code, {folder} ")
    assert "shadows the installed shadowplug; run from another directory" in reason
    assert reason.endswith("AttributeError: module 'shadowplug' has no attribute 'contender'"), reason


def test_a_namespace_package_plugin_that_fails_for_its_own_reason_is_not_called_shadowed(tmp_path, monkeypatch):
    """PEP 420 namespaces are a plain way to ship plugins (acme/plug.py, no acme/__init__.py): one that fails on a
    missing dependency was told it was shadowed and to run from another directory."""
    from attnbench.contenders import registry

    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "plug.py").write_text("import not_installed_dep\ncontender = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def load():
        import importlib

        return importlib.import_module("acme.plug").contender

    entry = registry._make_entry("plug", "acme", load, "acme.plug")
    missing = "failed to load: ModuleNotFoundError: No module named 'not_installed_dep' (raised in <module>, plug.py:1)"
    assert entry.load_failure == missing, entry.load_failure
    for name in ("acme.plug", "acme"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_duplicate_entry_point_names_are_an_error_naming_both(tmp_path):
    fake_distribution(tmp_path, "evil-twin", {"bmm": "twin:contender"}, {"twin": "contender = None\n"})
    result = run_subprocess(*attnbench_cmd("list"), env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "'bmm' is registered twice" in lines[0]
    assert "attnbench.impls.bmm:contender (attnbench" in lines[0] and "twin:contender (evil-twin 1.0)" in lines[0]


def test_a_contender_is_asked_whether_it_runs_here_only_when_a_sweep_needs_it(planted):
    """fused_cpu's probe builds its C++ library (about 20 s on a first run): `run --impl bmm` must not wait for
    it, nor must a bad flag's error. ``available`` asks each contender once; a named one is asked by its rows."""
    asked: list[str] = []

    class CostlyProbe(Shifted):
        name = "planted_costly_probe"

        def availability(self):
            asked.append(self.name)
            return "needs an hour's build"

    attnbench.register(CostlyProbe)
    planted.append("planted_costly_probe")
    registry.load(refresh=True)
    _, cases = plan_cases(RunRequest(suite="quick", axes={"impl": ["bmm"]}))
    assert {impl for impl, _ in cases} == {"bmm"} and asked == []
    _, cases = plan_cases(RunRequest(suite="quick", axes={"impl": ["available"]}))
    assert "planted_costly_probe" not in {impl for impl, _ in cases} and "bmm" in {impl for impl, _ in cases}
    assert registry.get("planted_costly_probe").unavailable_reason == "needs an hour's build"
    assert asked == ["planted_costly_probe"]  # once, however often it is asked
