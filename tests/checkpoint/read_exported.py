"""PyTorch's side of checkpoint_export_test: reads what `parallax_checkpoint export`
wrote, as a Python user does, and writes weights back the ways a Python user can.

    read_exported.py EXPORTED.pt EXPORTED.safetensors OUT_PREFIX

torch.load (weights_only, PyTorch's default) must give a dict of tensors, the
safetensors library the same names and values; their sum (each tensor in float64) is
printed as "python checksum X" for the test to compare with the C++ reader's. Then:
OUT_PREFIX.safetensors (safetensors.torch.save_file), OUT_PREFIX.pt (torch.save of a
plain dict, which LibTorch reads) and OUT_PREFIX.state_dict.pt (torch.save of an
OrderedDict with _metadata, as Module.state_dict() returns, which LibTorch cannot read).
"""

import collections
import sys

import torch
from safetensors.torch import load_file, save_file

exported_pt, exported_safetensors, out = sys.argv[1:4]
state = torch.load(exported_pt, weights_only=True)
assert isinstance(state, dict), type(state)
other = load_file(exported_safetensors)
assert list(state) == list(other), (list(state), list(other))
for name, tensor in state.items():
    assert torch.equal(tensor, other[name]), name
checksum = sum(tensor.double().sum().item() for tensor in state.values())

save_file(state, out + ".safetensors")
torch.save(dict(state), out + ".pt")
state_dict = collections.OrderedDict(state)
state_dict._metadata = collections.OrderedDict({"": {"version": 1}})
torch.save(state_dict, out + ".state_dict.pt")
print(f"python: {len(state)} tensors; python checksum {checksum:.9g}")
