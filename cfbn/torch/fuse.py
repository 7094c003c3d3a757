"""Fusing a ReLU, or a residual add and a ReLU, into the batch norm before it,
where the three meet inside a module's own ``forward`` (found with torch.fx).

The patterns, in one module's traced ``forward`` (every submodule a leaf):

- ``relu(bn(x))``;
- ``relu(bn(x) + other)`` or ``relu(other + bn(x))`` (``+``, ``+=``,
  ``torch.add`` or ``.add``/``.add_`` without ``alpha``),

where ``bn`` is a cfbn.torch ``BatchNorm1d/2d/3d`` without an activation,
called once with one argument, and each intermediate value has no other
use; ``relu`` is an ``nn.ReLU`` module, ``F.relu``, ``torch.relu`` or
``torch.relu_``, or the ``.relu()``/``.relu_()`` method.  The batch norm
becomes ``activation="relu"`` called as ``bn(x, other)``, and the module's
forward becomes the rewritten graph (a ``torch.fx.GraphModule``).

A module is left as it is when its forward cannot be traced (control flow
on tensor values), when it traces differently in training and in eval mode
(its code reads ``self.training``), or when no pattern is found.
"""
import collections
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

_RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_)
_RELU_METHODS = ("relu", "relu_")
_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
_ADD_METHODS = ("add", "add_")


class _OwnForward(fx.Tracer):
    """Traces one module's own forward: every submodule is a leaf."""

    def is_leaf_module(self, m, module_qualified_name):
        return True


def _trace(module):
    """The graph of `module`'s own forward, or None where tracing fails or
    depends on the training flag."""
    flags = [(m, m.training) for m in module.modules()]
    graphs = []
    try:
        for mode in (module.training, not module.training):
            module.train(mode)
            graphs.append(_OwnForward().trace(module))
    except Exception:  # noqa: BLE001 (any failure to trace means: leave it alone)
        return None
    finally:
        for m, training in flags:
            m.training = training
    if graphs[0].python_code("self").src != graphs[1].python_code("self").src:
        return None
    return graphs[0]


def _is_relu(node, modules):
    if node.op == "call_module":
        return type(modules.get(node.target)) is nn.ReLU and len(node.args) == 1
    if node.op == "call_function":
        # F.relu(x, inplace) takes the flag by position too
        return node.target in _RELU_FUNCTIONS and 1 <= len(node.args) <= 2 and \
            all(not isinstance(a, fx.Node) for a in node.args[1:]) and \
            set(node.kwargs) <= {"inplace"}
    if node.op == "call_method":
        return node.target in _RELU_METHODS and len(node.args) == 1 and not node.kwargs
    return False


def _is_add(node):
    adds = {"call_function": _ADD_FUNCTIONS, "call_method": _ADD_METHODS}.get(node.op, ())
    return node.target in adds and len(node.args) == 2 and not node.kwargs and \
        all(isinstance(a, fx.Node) for a in node.args)


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _fusable_bn(node, modules, calls, kinds):
    if node.op != "call_module" or calls[node.target] != 1:
        return False
    bn = modules.get(node.target)
    return type(bn) in kinds and bn.activation is None and len(node.args) == 1 and \
        not node.kwargs and isinstance(node.args[0], fx.Node)


def _set_submodule(root, target, module):
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def fuse_graph(module, kinds, swap):
    """`module` with its forward's patterns fused (a GraphModule holding
    the same submodules, parameters and buffers), or None when it has none.

    `kinds` are the batch-norm classes that may fuse; `swap(bn)` gives the
    fused replacement of one."""
    graph = _trace(module)
    if graph is None:
        return None
    modules = dict(module.named_modules())
    calls = collections.Counter(n.target for n in graph.nodes if n.op == "call_module")
    fused = 0
    for node in list(graph.nodes):
        if not _fusable_bn(node, modules, calls, kinds):
            continue
        user = _only_user(node)
        if user is None:
            continue
        side = None
        relu = user
        if _is_add(user):
            a, b = user.args
            side = b if a is node else a
            if side is node:
                continue  # bn(x) + bn(x)
            relu = _only_user(user)
            if relu is None:
                continue
        if not _is_relu(relu, modules):
            continue
        args = (node.args[0],) if side is None else (node.args[0], side)
        with graph.inserting_before(relu):
            new = graph.call_module(node.target, args)
        relu.replace_all_uses_with(new)
        graph.erase_node(relu)
        if side is not None:
            graph.erase_node(user)
        graph.erase_node(node)
        _set_submodule(module, node.target, swap(modules[node.target]))
        fused += 1
    if not fused:
        return None
    graph.lint()
    gm = fx.GraphModule(module, graph, class_name=type(module).__name__)
    # GraphModule copies only what the graph uses (and stands empty modules
    # in for the parents of a nested target): hand over module's own
    # children, parameters and buffers, in their order, so that the module
    # tree and the state_dict stay those of `module`.
    gm._modules.clear()
    gm._modules.update(module._modules)
    gm._parameters.clear()
    gm._parameters.update(module._parameters)
    gm._buffers.clear()
    gm._buffers.update(module._buffers)
    gm._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    gm.training = module.training
    # and its plain attributes (a ResNet block's `downsample = None`, its
    # `stride`), which the traced code no longer reads but callers may
    for name, value in vars(module).items():
        if not name.startswith("_") and name not in vars(gm) and name != "forward":
            setattr(gm, name, value)
    return gm
