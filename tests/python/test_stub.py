"""The type stub (pinpool/__init__.pyi) and the module agree, and every
public call is documented (docs/python.md, "Types and help()").

The stub is the one beside the imported module (in the build tree, or the
installed copy: the test of the installed package checks that it ships).
It is parsed with ast; the module is read with inspect, which takes the
signatures of the C methods from their docstrings ("name($self, ...)\\n--").
For every public name: present in both; a method is a method and an
attribute a property in both; the same parameters, in the same order, of
the same kinds (positional-only, keyword-only...), with the same defaults.
"""

import ast
import inspect
import os
import types

import pytest

import pinpool
from conftest import needs_torch

STUB = os.path.join(os.path.dirname(pinpool.__file__), "__init__.pyi")

# Dunder methods that are part of the classes' public interface.
PUBLIC_DUNDERS = {"__dlpack__", "__dlpack_device__", "__enter__", "__exit__",
                  "__len__"}

KINDS = {"posonly": inspect.Parameter.POSITIONAL_ONLY,
         "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "vararg": inspect.Parameter.VAR_POSITIONAL,
         "kwonly": inspect.Parameter.KEYWORD_ONLY,
         "kwarg": inspect.Parameter.VAR_KEYWORD}

NO_DEFAULT = object()


def stub_tree():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read(), STUB)


def is_overload(fn):
    return any(isinstance(d, ast.Name) and d.id == "overload"
               for d in fn.decorator_list)


def is_property(fn):
    return any(isinstance(d, ast.Name) and d.id == "property"
               for d in fn.decorator_list)


def stub_params(fn):
    """[(name, kind, default)] of an ast function; default is NO_DEFAULT,
    Ellipsis (unspecified in the stub) or the literal value."""
    a = fn.args

    def default(node):
        if node is None:
            return NO_DEFAULT
        value = ast.literal_eval(node)
        return value

    out = []
    positional = a.posonlyargs + a.args
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
    for i, arg in enumerate(positional):
        kind = "posonly" if i < len(a.posonlyargs) else "args"
        out.append((arg.arg, KINDS[kind], default(pos_defaults[i])))
    if a.vararg:
        out.append((a.vararg.arg, KINDS["vararg"], NO_DEFAULT))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, KINDS["kwonly"], default(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, KINDS["kwarg"], NO_DEFAULT))
    return out


def runtime_params(obj, method):
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        d = NO_DEFAULT if p.default is inspect.Parameter.empty else p.default
        out.append((p.name, p.kind, d))
    return out


def compare(where, stub_fns, runtime, method):
    """Each stub definition (one, or the overloads) against the runtime
    signature. Overloads may leave defaults out (that is what they are
    for); a single definition may not."""
    rt = runtime_params(runtime, method)
    for fn in stub_fns:
        st = stub_params(fn)
        if method:  # self: its kind differs between C and stub spelling
            assert st and st[0][0] == "self", f"{where}: no self in stub"
            st = st[1:]
            rt_cmp = rt[1:] if rt and rt[0][0] == "self" else rt
        else:
            rt_cmp = rt
        assert [(n, k) for n, k, _ in st] == [(n, k) for n, k, _ in rt_cmp], (
            f"{where}: stub {st} != module {rt_cmp}")
        for (n, _, sd), (_, _, rd) in zip(st, rt_cmp):
            if sd is NO_DEFAULT:
                assert rd is NO_DEFAULT or len(stub_fns) > 1, (
                    f"{where}: {n} has a default in the module, not the stub")
            elif sd is not Ellipsis:
                assert sd == rd, f"{where}: {n}={sd!r} in the stub, {rd!r}"


def stub_members(tree):
    """{name: node-or-list} at module level, and per class."""
    top, classes = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            top.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            members = {}
            for m in node.body:
                if isinstance(m, ast.FunctionDef):
                    members.setdefault(m.name, []).append(m)
            classes[node.name] = members
            top[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            top[node.target.id] = node
        elif isinstance(node, ast.ImportFrom) and node.module == "pinpool":
            for alias in node.names:
                if alias.asname == alias.name:  # a re-export
                    top[alias.name] = node
    return top, classes


def test_stub_ships_with_the_module():
    assert os.path.isfile(STUB), f"no stub beside {pinpool.__file__}"
    marker = os.path.join(os.path.dirname(pinpool.__file__), "py.typed")
    assert os.path.isfile(marker), "no py.typed (PEP 561)"


def test_same_public_names():
    top, _ = stub_members(stub_tree())
    public_stub = {n for n in top if not n.startswith("_")} | (
        {"__version__"} if "__version__" in top else set())
    # pinpool.torch: a submodule, in the stub but not in __all__ (a star
    # import must not import torch).
    assert "torch" in public_stub and "torch" not in pinpool.__all__
    assert public_stub - {"torch"} == set(pinpool.__all__)
    for name in pinpool.__all__:
        assert hasattr(pinpool, name), name


@pytest.mark.parametrize("cls", ["Pool", "Buffer"])
def test_class_members_agree(cls):
    _, classes = stub_members(stub_tree())
    stub = classes[cls]
    rt_cls = getattr(pinpool, cls)
    runtime = {n for n in vars(rt_cls)
               if not n.startswith("_") or n in PUBLIC_DUNDERS}
    if cls == "Pool":
        # The constructor: tp_new in C, __init__ in the stub.
        compare("Pool()", stub["__init__"], rt_cls, method=True)
        stub = {n: v for n, v in stub.items() if n != "__init__"}
    assert set(stub) == runtime, (
        f"only in the stub: {set(stub) - runtime}; "
        f"only in the module: {runtime - set(stub)}")
    for name, fns in stub.items():
        attr = inspect.getattr_static(rt_cls, name)
        where = f"{cls}.{name}"
        if inspect.isdatadescriptor(attr):
            assert all(is_property(f) for f in fns), f"{where}: a property"
            continue
        assert not any(is_property(f) for f in fns), f"{where}: a method"
        assert len(fns) == 1 or all(is_overload(f) for f in fns), where
        if isinstance(attr, types.WrapperDescriptorType):
            # A type slot (__len__): CPython's wrapper, whose signature
            # only some versions give (not 3.13).
            continue
        compare(where, fns, getattr(rt_cls, name), method=True)


def test_module_functions_agree():
    top, _ = stub_members(stub_tree())
    for name in ("default_pool", "alloc", "asarray"):
        compare(name, top[name], getattr(pinpool, name), method=False)


def test_every_public_call_is_documented():
    for cls in (pinpool.Pool, pinpool.Buffer):
        assert len(cls.__doc__ or "") > 200, cls
        assert "thread" in cls.__doc__.lower(), cls
        for name in vars(cls):
            if name.startswith("_") and name not in PUBLIC_DUNDERS:
                continue
            attr = inspect.getattr_static(cls, name)
            if isinstance(attr, types.WrapperDescriptorType):
                continue  # a type slot: CPython's own docstring
            doc = attr.__doc__ or ""
            assert len(doc) > 10, f"{cls.__name__}.{name}: no docstring"
            if inspect.isdatadescriptor(attr) or name in PUBLIC_DUNDERS:
                continue
            # A method says how it may be used from several threads and
            # what it raises (or that it raises as another call).
            assert "thread" in doc.lower(), f"{cls.__name__}.{name}"
            assert "raise" in doc.lower() or "Idempotent" in doc or \
                name in ("stats", "memory_stats", "memory_summary",
                         "reset_peak_stats", "process_events", "synchronize"), \
                f"{cls.__name__}.{name}: no word on errors"
    for fn in (pinpool.default_pool, pinpool.alloc, pinpool.asarray):
        assert "Raises" in fn.__doc__ and "hread" in fn.__doc__, fn


@needs_torch
def test_torch_helpers_are_typed_and_documented():
    import pinpool.torch as ppt

    for name in ppt.__all__:
        fn = getattr(ppt, name)
        assert len(fn.__doc__ or "") > 40, name
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, name
        for p in sig.parameters.values():
            assert p.annotation is not inspect.Parameter.empty, (name, p)


def typed_dict_fields(tree, name):
    node = next(n for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == name)
    return {m.target.id: ast.unparse(m.annotation) for m in node.body
            if isinstance(m, ast.AnnAssign)}


def test_stats_and_attributes_typed_dicts_agree(pool):
    tree = stub_tree()
    st = pool.stats()
    fields = typed_dict_fields(tree, "_Stats")
    assert set(fields) == set(st)
    for key, value in st.items():
        if isinstance(value, dict):
            sub = typed_dict_fields(tree, fields[key])
            assert set(sub) == set(value), key
        else:
            assert fields[key] == type(value).__name__, key
    buf = pool.alloc(64)
    assert set(typed_dict_fields(tree, "_Attributes")) == set(buf.attributes)
    buf.close()
