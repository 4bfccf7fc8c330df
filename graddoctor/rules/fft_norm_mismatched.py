from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

# a transform and the inverse that undoes it, one table per direction
_FORWARD = {"fft", "rfft", "fft2", "rfft2", "fftn", "rfftn"}
_INVERSE = {"ifft", "irfft", "ifft2", "irfft2", "ifftn", "irfftn"}
_DEFAULT_NORM = "backward"


def _fft_call(node: ast.AST) -> tuple[str, str | None] | None:
    """``("forward"|"inverse", norm)`` for a call of an FFT module's transform
    (``torch.fft.rfft2(x, norm="ortho")``, ``fft.ifft(x)``, ``np.fft.rfft(x)``): the norm
    spelled (its default when none is given); None for any other call or a norm that is not a
    literal."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    owner_name = owner.attr if isinstance(owner, ast.Attribute) else \
        owner.id if isinstance(owner, ast.Name) else None
    if owner_name != "fft":
        return None
    name = node.func.attr
    side = "forward" if name in _FORWARD else "inverse" if name in _INVERSE else None
    if side is None:
        return None
    norm = next((k.value for k in node.keywords if k.arg == "norm"), None)
    if norm is None:
        return side, _DEFAULT_NORM
    if isinstance(norm, ast.Constant) and (norm.value is None or isinstance(norm.value, str)):
        return side, norm.value or _DEFAULT_NORM
    return None  # a norm given by a name: not read


def _assignments(scope: ast.AST) -> list[tuple[set[str], ast.AST]]:
    """``(names written, value)`` for each assignment of ``scope`` outside nested functions; a
    write into an item or an attribute (``out_ft[:, :m] = ...``) writes its base name."""
    out = []
    for node in walk(scope):
        if node is not scope and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = set()
        for target in targets:
            for sub in walk(target):
                while isinstance(sub, (ast.Subscript, ast.Attribute, ast.Starred)):
                    sub = sub.value
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
        out.append((names, value))
    return out


def _input(call: ast.Call) -> ast.AST:
    """The tensor a transform is taken of: its first argument (``input=`` by keyword)."""
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "input"), call)


def _reaches(source: ast.Call, expr: ast.AST, assignments) -> bool:
    """Whether ``expr`` reads the result of the call ``source``, directly or through the names
    the scope assigns from it (in any order: a loop may carry them)."""
    derived: set[str] = set()
    def reads(node: ast.AST) -> bool:
        return any(sub is source or (isinstance(sub, ast.Name) and sub.id in derived) for sub in walk(node))
    changed = True
    while changed:
        changed = False
        for names, value in assignments:
            if not names <= derived and reads(value):
                derived |= names
                changed = True
    return reads(expr)


def mismatched_fft_pairs(tree: ast.AST) -> list[tuple[int, str, str, int, str, str]]:
    """``(line, text, norm, other_line, other_text, other_norm)`` for each function (or the
    module's top level) that takes a transform and its inverse under different ``norm``
    conventions, every transform of the scope under one norm and every inverse under another;
    ``line`` is the call that spells its norm (the forward one when both do)."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = {id(n) for f in scopes for n in walk(f) if n is not f}
    for scope in scopes + [tree]:
        calls = {"forward": [], "inverse": []}
        for node in walk(scope):
            if node is not scope and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda, ast.ClassDef)):
                continue
            if scope is tree and id(node) in inner:
                continue
            got = _fft_call(node)
            if got is not None:
                calls[got[0]].append((node, got[1]))
        if not calls["forward"] or not calls["inverse"]:
            continue
        forward_norms = {norm for _, norm in calls["forward"]}
        inverse_norms = {norm for _, norm in calls["inverse"]}
        if len(forward_norms) != 1 or len(inverse_norms) != 1 or forward_norms == inverse_norms:
            continue
        # only an inverse of what a transform of the scope produced undoes it: an inverse of a
        # spectrum made otherwise (random-phase noise) beside a transform only scored (a
        # spectral loss) is no pair
        assignments = _assignments(scope)
        pairs = [(fwd, inv) for inv, _ in calls["inverse"] for fwd, _ in calls["forward"]
                 if _reaches(fwd, _input(inv), assignments)]
        if not pairs:
            continue
        (fwd, inv), fnorm, inorm = pairs[0], forward_norms.pop(), inverse_norms.pop()
        spelled = lambda n: any(k.arg == "norm" for k in n.keywords)  # noqa: E731
        first, second = ((inv, inorm), (fwd, fnorm)) if spelled(inv) and not spelled(fwd) \
            else ((fwd, fnorm), (inv, inorm))
        found.append((first[0].lineno, ast.unparse(first[0]), first[1],
                      second[0].lineno, ast.unparse(second[0]), second[1]))
    return sorted(set(found))


class FftNormMismatched(Rule):
    """
    ## What it does
    Finds a Fourier transform and its inverse taken in one function under different `norm`
    conventions: `torch.fft.rfft2(x, norm="ortho")` undone by `torch.fft.irfft2(out_ft, s=...)`
    (whose default is `"backward"`), `fft(x, norm="forward")` with `ifft(x, norm="ortho")` —
    a Fourier neural operator's spectral convolution, a spectral derivative, a Fourier filter.
    Every forward transform of the function uses one norm and every inverse another, each
    inverse taken of what a transform of the function produced (through the names assigned
    from it). Read from the source of the files a backward ran from.

    ## Why is this bad?
    The pair only round-trips when both sides use the same convention: mixing them scales
    everything that goes through the spectral path by `sqrt(n)` or `n` (`1/32` for a 32×32
    grid with `"ortho"` then `"backward"`). Nothing fails: the layer's output is just far too
    small (or too large), so the spectral weights start as good as dead, the pointwise path
    does the work, and the operator learns slowly and worse, or the derivative a physics loss
    uses is off by a constant factor.

    ## Example
    ```python
    x_ft = torch.fft.rfft2(x, norm="ortho")
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], w)
    return torch.fft.irfft2(out_ft, s=(H, W))
    ```

    ## Use instead
    ```python
    x_ft = torch.fft.rfft2(x, norm="ortho")
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], w)
    return torch.fft.irfft2(out_ft, s=(H, W), norm="ortho")
    ```

    ## Stays silent on
    Both sides with the same norm (both default, both `"ortho"`, `"forward"` with
    `"forward"`); a function that only transforms (a spectrum for a loss or a log) or only
    inverts; a norm given by a variable; functions that mix several norms on one side; files
    no backward ran from.
    """

    code = "GD391"
    slug = "fft-norm-mismatched"
    severity = Severity.WARNING
    summary = ("a Fourier transform and its inverse in one function use different norm "
               "conventions: the round trip scales the spectral path by sqrt(n) or n")
    fix = "give the transform and its inverse the same norm= (both default, or both \"ortho\")"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, norm, other, other_text, other_norm in mismatched_fft_pairs(tree):
                yield self.finding(
                    f"`{text}` uses norm=\"{norm}\" while its inverse at line {other} "
                    f"(`{other_text}`) uses norm=\"{other_norm}\": the pair does not round-trip, "
                    f"so everything through this spectral path is scaled by a constant "
                    f"(sqrt(n) or n for n grid points) and its weights start far off their scale",
                    Location(path, line),
                    related=(Related(Location(path, other), "the other side of the pair"),),
                    evidence={"norm": norm, "other_norm": other_norm, "other_line": other},
                    fix=(f"use one convention on both sides: norm=\"{norm}\" on the other call "
                         f"too, or drop norm= from both"))
