"""The package boundaries, read from the source: the gateway (data plane) and
the controller (control plane) are siblings that never import each other;
they agree through `contract`, which imports neither (nor anything else of
specgate); only `specgate` (the composition and the CLI) may import both. `testbed`
(what tests and benchmarks start and measure) imports neither plane nor the
composition (the sim replica's token scheme in `drafters` it shares), and
neither it nor `bench/` ever imports `tests/`.
No cycle inside one package either, TYPE_CHECKING imports included: a cycle
there is still a pair of modules that cannot be read one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "gateway", "controller", "drafters", "specgate", "testbed")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module this file imports, at any depth (function bodies included)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


GRAPH = _graph()


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("gateway", {"controller", "specgate"}),
        ("controller", {"gateway", "specgate"}),
        ("contract", {"gateway", "controller", "drafters", "specgate"}),
        ("drafters", {"gateway", "controller", "specgate"}),
        ("testbed", {"gateway", "controller", "specgate"}),
    ],
)
def test_no_import_edge_across_the_boundary(importer, forbidden):
    edges = sorted(
        f"{src} -> {dst}" for src, dsts in GRAPH.items() if _top(src) == importer for dst in dsts if _top(dst) in forbidden
    )
    assert not edges, f"{importer} must not import {sorted(forbidden)}:\n" + "\n".join(edges)


@pytest.mark.parametrize("tree", ["bench", "testbed"])
def test_benchmarks_and_the_testbed_never_import_the_tests(tree):
    """What a bench needs from the tests' tooling lives in `testbed`, so a bench runs
    from a tree without tests and the tests can change without breaking a bench."""
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / tree).rglob("*.py")
        for module in _imports(path)
        if module == "tests" or module.startswith("tests.")
    )
    assert not offenders, "\n".join(offenders)


def _cycles_within(package: str) -> list[list[str]]:
    nodes = {m for m in GRAPH if _top(m) == package}
    edges = {m: {d for d in GRAPH[m] if d in nodes and not (d == package)} for m in nodes}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package):
    """A package's `__init__` re-exporting its modules is not a cycle worth
    the name; every other strongly connected component is."""
    assert _cycles_within(package) == []


def test_the_graph_sees_the_tree():
    """Guard against a walker that finds nothing (and so passes everything)."""
    assert "contract.policy" in GRAPH["controller.service"]
    assert "gateway.app" in GRAPH["specgate.node"] and "controller.service" in GRAPH["specgate.node"]


def test_only_the_controller_writes_the_policy_set():
    """One writer: the controller's loop and its admin API publish policies
    (`contract.policy.publish_policies`); the gateway only reads them."""
    writers = sorted(
        name for name, path in ((_module_name(p), p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
        if "contract.policy.publish_policies" in _imports(path)
    )
    assert writers and all(_top(w) == "controller" for w in writers), writers


# gateway.stream's modules, top to bottom: each imports only modules below it,
# so a streamed request passes each once, in order, and never returns to one
# it left (relay -> taps -> sse / ledger -> splice -> continuation -> ends).
STREAM_ORDER = ("relay", "splice", "continuation", "taps", "ledger", "shape", "sse", "ends")


def test_the_stream_package_is_layered_in_one_order():
    package = {m for m in GRAPH if m.startswith("gateway.stream.")}
    assert package == {f"gateway.stream.{name}" for name in STREAM_ORDER}, "a stream module is missing from STREAM_ORDER"
    upward = sorted(
        f"{src} -> {dst}"
        for src in package
        for dst in GRAPH[src]
        if dst in package and STREAM_ORDER.index(dst.rpartition(".")[2]) <= STREAM_ORDER.index(src.rpartition(".")[2])
    )
    assert not upward, "a stream module imports one above it:\n" + "\n".join(upward)


def test_streams_are_entered_through_the_relay_and_ended_through_ends():
    """Outside the package, only the relay stage starts a stream (`gateway.stream.relay`), and the in-band
    error helpers that the relay and the outcome stage share come from `gateway.stream.ends`, not the relay."""
    starts = sorted(m for m, deps in GRAPH.items() if "gateway.stream.relay" in deps and not m.startswith("gateway.stream."))
    assert starts == ["gateway.relay"]
    assert "gateway.stream.ends" in GRAPH["gateway.outcome"] and "gateway.relay" not in GRAPH["gateway.outcome"]
    relay_importers = sorted(m for m, deps in GRAPH.items() if "gateway.relay" in deps and _top(m) == "gateway")
    assert relay_importers == ["gateway.proxy"]


_FRAMING = (b"\n\n", b"\\n\\n", b"data:", b"[DONE]")


def test_sse_framing_is_written_in_one_place():
    """SSE framing (the blank line that ends an event, the `data:` field,
    `[DONE]`) is spelled only by `contract.wire` (which builds it) and
    `gateway.stream.sse` (which reads it); every other gateway module uses
    their constants, so the gateway cannot split or frame events two ways."""
    offenders = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if path == ROOT / "gateway" / "stream" / "sse.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and any(f in node.value for f in _FRAMING):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:40]!r}")
    assert not offenders, "\n".join(offenders)
    spelled = [n.value for n in ast.walk(ast.parse((ROOT / "gateway/stream/sse.py").read_text())) if isinstance(n, ast.Constant)]
    assert any(isinstance(v, bytes) and b"[DONE]" in v for v in spelled)  # the walker sees constants at all


def test_routing_is_modelled_once():
    """What profile a policy wants and which replicas it may use are
    `contract.routing`'s: the gateway ranks by them and the controller prices
    placements on them, so the two planes cannot route differently."""
    assert "contract.routing.speculation_tier" in _imports(ROOT / "gateway" / "routing.py")
    assert "contract.routing.speculation_tier" in _imports(ROOT / "controller" / "decision" / "placement.py")
    tiers = sorted(
        f"{p.relative_to(ROOT)}" for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.FunctionDef) and node.name in ("speculation_tier", "wanted_profile", "drafter_order")
    )
    assert tiers == ["contract/routing.py"] * 3


@pytest.mark.parametrize("name", ["DrafterSpec", "StreamLedger", "CapturePlan"])
def test_one_definition_per_shared_class(name):
    defined = sorted(
        f"{p.relative_to(ROOT)}" for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.ClassDef) and node.name == name
    )
    assert len(defined) == 1, defined
