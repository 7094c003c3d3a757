"""A module of another class holding everything an old one held.

convert replaces a batch norm by a cfbn one; what users built around the old
module must keep working with the new one: an optimizer holding its
Parameter objects, hooks (and their handles' remove()), the state_dict and
its keys' order, pruning's ``weight_orig``/``weight_mask`` and pre-hook,
attributes such as ``qconfig``.
"""
import collections

# The dicts of hooks, shared rather than copied: a RemovableHandle holds a
# weak reference to the dict its hook lives in, so `handle.remove()` keeps
# working on the new module.
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


def rebuild(old, cls, *args, **kwargs):
    """A `cls` module built from ``cls(*args, **kwargs)`` then handed `old`'s
    parameters, buffers, children, hooks, training flag and other
    attributes, as the same objects and in the same order.

    Parameters
    ----------
    old : torch.nn.Module
        The module being replaced; left as it was.
    cls : type
        The new module's class.
    *args, **kwargs
        Its constructor's arguments (without device and dtype: it is built
        on the meta device, its own tensors being replaced by `old`'s).

    Returns
    -------
    torch.nn.Module
    """
    new = cls(*args, device="meta", **kwargs)
    new._parameters = collections.OrderedDict(old._parameters)
    new._buffers = collections.OrderedDict(old._buffers)
    new._non_persistent_buffers_set = set(old._non_persistent_buffers_set)
    new._modules = collections.OrderedDict(old._modules)
    for name in _HOOK_DICTS:
        if hasattr(old, name):
            setattr(new, name, getattr(old, name))
    if hasattr(old, "_is_full_backward_hook"):
        new._is_full_backward_hook = old._is_full_backward_hook
    new.training = old.training
    # Plain attributes the new class does not have: qconfig, a pruned
    # ``weight`` (recomputed by pruning's pre-hook), a user's own marks.
    mine = vars(new)
    for name, value in vars(old).items():
        if name not in mine:
            mine[name] = value
    return new

