"""Code cells: which names a cell binds in the notebook's namespace, and which it reads from it."""
from __future__ import annotations

import ast
import builtins
import re

# Names a notebook's cell finds without any cell binding them: Python's builtins and IPython's.
_IPYTHON_NAMES = {"display", "get_ipython", "In", "Out", "exit", "quit", "_", "__", "___",
                  "_i", "_ii", "_iii", "_ih", "_oh", "_dh", "__name__", "__builtins__", "__doc__"}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def is_builtin(name: str) -> bool:
    """Whether a notebook has ``name`` before any cell binds it."""
    return name in _IPYTHON_NAMES or hasattr(builtins, name) or re.fullmatch(r"_i?\d+", name) is not None


def parse(source: str) -> ast.Module | None:
    """The cell's code as Python (``None`` if it is not), its IPython magics and shell escapes
    read as ``pass``."""
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip()
        lines.append(line[:len(line) - len(stripped)] + "pass" if stripped.startswith(("%", "!")) else line)
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


class _TopLevelBindings(ast.NodeVisitor):
    """Names a cell binds in the notebook's namespace (not the locals of its functions)."""

    def __init__(self) -> None:
        self.names: set[str] = set()         # every name bound
        self.other: set[str] = set()         # bound otherwise than by an import

    def _bind(self, name: str) -> None:
        self.names.add(name)
        self.other.add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._bind(node.id)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def _def(self, node) -> None:
        self._bind(node.name)
        for d in node.decorator_list:
            self.visit(d)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_Lambda(self, node) -> None:
        pass

    def visit_ListComp(self, node) -> None:       # comprehension variables are local
        pass

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def visit_Import(self, node) -> None:
        for alias in node.names:
            self.names.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import


def _statement_bindings(statement: ast.AST) -> set[str]:
    v = _TopLevelBindings()
    v.visit(statement)
    return v.names


def bound_names(source: str, *, imports: bool = True) -> set[str]:
    """Names the cell binds at the top level (with ``imports=False``: other than by an import)."""
    tree = parse(source)
    if tree is None:
        return set()
    v = _TopLevelBindings()
    v.visit(tree)
    return v.names if imports else v.other


def _argument_names(args: ast.arguments) -> set[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def _local_names(body: list[ast.AST]) -> set[str]:
    """The names a function body binds (its locals), less those it declares global or nonlocal."""
    stored, declared = set(), set()
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            stored.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stored.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            stored.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
        todo.extend(ast.iter_child_nodes(node))
    return stored - declared


class _Reads(ast.NodeVisitor):
    """The names a statement reads from the notebook's namespace: when it runs (``now``), or only
    when a function or lambda it defines is called (``later``)."""

    def __init__(self) -> None:
        self.now: set[str] = set()
        self.later: set[str] = set()
        self._scopes: list[tuple[set[str], bool]] = []      # (local names, a class body) innermost last
        self._deferred = 0

    def _read(self, name: str) -> None:
        for depth, (names, is_class) in enumerate(reversed(self._scopes)):
            if name in names and (depth == 0 or not is_class):     # a class body's names: not its methods'
                return
        (self.later if self._deferred else self.now).add(name)

    def _inside(self, names: set[str], body: list[ast.AST], *, deferred: bool, is_class: bool = False) -> None:
        self._scopes.append((names, is_class))
        self._deferred += deferred
        for node in body:
            self.visit(node)
        self._deferred -= deferred
        self._scopes.pop()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:      # x += 1 reads x
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
        self.generic_visit(node)

    def _defaults(self, args: ast.arguments) -> None:
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(d)

    def _function(self, node) -> None:                       # decorators, defaults, annotations: now
        args = node.args
        annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.annotation]
        for part in [*node.decorator_list, *annotations, *([node.returns] if node.returns else [])]:
            self.visit(part)
        self._defaults(node.args)
        self._inside(_argument_names(node.args) | _local_names(node.body), node.body, deferred=True)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._defaults(node.args)
        self._inside(_argument_names(node.args), [node.body], deferred=True)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for part in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(part)
        self._inside(_local_names(node.body), node.body, deferred=False, is_class=True)

    def _comprehension(self, node) -> None:
        first, *rest = node.generators
        self.visit(first.iter)                                   # evaluated where the comprehension is
        targets = set().union(*(_statement_bindings(g.target) for g in node.generators))
        parts = [first.target, *first.ifs] + [x for g in rest for x in (g.target, g.iter, *g.ifs)]
        parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._inside(targets, parts, deferred=False)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _statements(source: str) -> list[ast.stmt] | None:
    tree = parse(source)
    return None if tree is None else tree.body


def used_names(source: str) -> set[str]:
    """Names the cell reads from the notebook's namespace, now or when its functions are called:
    not those it has bound itself in an earlier statement, nor its functions' own locals."""
    statements = _statements(source)
    if statements is None:
        return set(re.findall(r"[A-Za-z_]\w*", source))     # not Python: assume it may use anything
    used: set[str] = set()
    bound: set[str] = set()
    for statement in statements:
        v = _Reads()
        v.visit(statement)
        used |= (v.now | v.later) - bound
        bound |= _statement_bindings(statement)
    return used


def immediate_reads(source: str) -> set[str]:
    """Names the cell surely reads when it runs (not inside a function it defines), and that
    neither the statement reading them nor one before it binds. Empty if the cell is not Python."""
    statements = _statements(source) or []
    reads: set[str] = set()
    bound: set[str] = set()
    for statement in statements:
        v = _Reads()
        v.visit(statement)
        bound |= _statement_bindings(statement)
        reads |= v.now - bound
    return reads


def defined_functions(source: str) -> list[str]:
    """The functions the cell defines at its top level."""
    statements = _statements(source) or []
    return [n.name for n in statements if isinstance(n, _FUNCTIONS)]


def stub_raises(stub: str) -> bool:
    """Whether running the cell itself raises (a ``raise`` at the top level)."""
    statements = _statements(stub)
    return bool(statements) and any(isinstance(n, ast.Raise) for n in statements)


def raising_functions(source: str) -> set[str]:
    """The functions the cell defines whose body raises whatever happens (a ``raise`` at the top
    of their body, as a stub's ``raise NotImplementedError(...)``): calling one raises."""
    statements = _statements(source) or []
    return {n.name for n in statements
            if isinstance(n, _FUNCTIONS) and any(isinstance(s, ast.Raise) for s in n.body)}
