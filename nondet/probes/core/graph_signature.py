"""What a decode step recorded in a CUDA graph depends on (core/captured.py), read from its arguments.

signature(): every input tensor's shape, dtype, strides and device (a graph reads its inputs from buffers of
those), the addresses and shapes of the tensors an object argument holds (a cache: a graph writes where it was
recorded; the held static cache keeps them from call to call, static_caches.py), the other arguments' values, and
the kernels in force (step_key.kernels_state). Equal signatures may share one graph. host_values(): the plain
values such an object holds, which a step must not change, since a replay runs no Python.
"""

import torch

from nondet.probes.core.step_key import kernels_state

_SCALARS = (bool, int, float, str, type(None))


def host_values(inputs: dict) -> list:
    """(argument, where, attribute, value) of every plain value (int, float, bool, str) that an object argument
    (a cache) holds in its attributes, directly or in its layers (_attributes)."""
    return [(name, where, attribute, value)
            for name, obj in inputs.items() if not isinstance(obj, (torch.Tensor, dict, *_SCALARS))
            for where, attribute, value in _attributes(obj) if isinstance(value, _SCALARS)]


def signature(inputs: dict) -> tuple:
    """What the recorded launches depend on (module docstring): equal signatures may share one graph."""
    return (kernels_state(), *((name, _described(inputs[name])) for name in sorted(inputs)))


def _described(value):
    if isinstance(value, torch.Tensor):
        return "tensor", tuple(value.shape), value.dtype, value.stride(), str(value.device)
    if isinstance(value, dict):
        return "dict", tuple((key, _described(inner)) for key, inner in sorted(value.items()))
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_described(v) for v in value)
    return type(value).__qualname__, held_tensors(value)


def held_tensors(obj) -> tuple:
    """Address and shape of every tensor an object (a cache) holds in its attributes, directly or in its
    layers (a list of objects): the memory a recorded step reads and writes outside its inputs."""
    return tuple((where, attribute, value.data_ptr(), tuple(value.shape))
                 for where, attribute, value in _attributes(obj) if isinstance(value, torch.Tensor))


def _attributes(obj):
    """(where, attribute, value) for each attribute of obj (where: the attribute's name) and, for a list of
    objects in one (a cache's layers), each of theirs (where: "name.i")."""
    for name, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        yield name, "", value
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if hasattr(item, "__dict__") and not isinstance(item, torch.nn.Module):
                    yield from ((f"{name}.{i}", inner, v) for inner, v in sorted(vars(item).items()))
                elif isinstance(item, torch.Tensor):
                    yield f"{name}.{i}", "", item
