"""The layout's rules, read from the source: no import cycle among mlxcel_py modules (function-local
imports included, `if TYPE_CHECKING:` ones excepted), MLX imported only where it may be, and no API
dialect importing another. Prints each violation; exits 1 if there is any.

    python scripts/check_layout.py [ROOT]    # ROOT: the folder that holds mlxcel_py/ (default: the repo)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "mlxcel_py"
# Where `import mlx` / `import mlx_lm` may appear (prefixes of dotted module names).
MLX_ALLOWED = ("mlxcel_py.engine.runner", "mlxcel_py.engine.distributed", "mlxcel_py.models", "mlxcel_py.loadtest")
DIALECTS = ("openai", "llama", "anthropic", "responses", "ollama", "embeddings")


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__)."""
    names = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def targets(name: str, is_package: bool, node, known: dict[str, Path]) -> list[str]:
    """The dotted names one import statement reaches (third-party ones included, unresolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    out = [mod]
    for alias in node.names:
        sub = f"{mod}.{alias.name}"
        if sub in known:
            out.append(sub)
    return out


def graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges among our own modules, every external top-level package each module imports)."""
    known = module_names(root)
    edges: dict[str, set[str]] = {n: set() for n in known}
    external: dict[str, set[str]] = {n: set() for n in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in imports(tree):
            for target in targets(name, path.name == "__init__.py", node, known):
                if target in known and target != name:
                    edges[name].add(target)
                elif not target.startswith(PACKAGE):
                    external[name].add(target.split(".")[0])
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                    stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop(); on.discard(top); comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def dialect_of(name: str):
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "server" and parts[2] in DIALECTS else None


def violations(root: Path) -> list[str]:
    edges, external = graph(root)
    found = [f"import cycle: {' -> '.join(c)}" for c in cycles(edges)]
    for name, pkgs in sorted(external.items()):
        if pkgs & {"mlx", "mlx_lm"} and not name.startswith(MLX_ALLOWED):
            found.append(f"{name} imports {', '.join(sorted(pkgs & {'mlx', 'mlx_lm'}))}")
    for name, outs in sorted(edges.items()):
        mine = dialect_of(name)
        for target in sorted(outs):
            theirs = dialect_of(target)
            if mine and theirs and theirs != mine:
                found.append(f"dialect {mine} imports dialect {theirs}: {name} -> {target}")
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    found = violations(root)
    for line in found:
        print(line)
    print(f"{len(found)} layout violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
