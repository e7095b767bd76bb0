"""PyTorch's side of checkpoint_export_test: reads what `parallax_checkpoint export`
wrote, as a Python user does, and saves a state dict back as PyTorch does.

    read_exported.py EXPORTED.pt EXPORTED.safetensors RESAVED.pt

torch.load (weights_only, PyTorch's default) must give a dict of tensors, the
safetensors library the same names and values; their sum (each tensor in float64) is
printed as "python checksum X" for the test to compare with the C++ reader's. The
dict is then saved with torch.save as a Module.state_dict() is (an OrderedDict with
_metadata), for the test to import back.
"""

import collections
import sys

import torch
from safetensors.torch import load_file

exported_pt, exported_safetensors, resaved = sys.argv[1:4]
state = torch.load(exported_pt, weights_only=True)
assert isinstance(state, dict), type(state)
other = load_file(exported_safetensors)
assert list(state) == list(other), (list(state), list(other))
for name, tensor in state.items():
    assert torch.equal(tensor, other[name]), name
checksum = sum(tensor.double().sum().item() for tensor in state.values())

state_dict = collections.OrderedDict(state)
state_dict._metadata = collections.OrderedDict({"": {"version": 1}})
torch.save(state_dict, resaved)
print(f"python: {len(state)} tensors; python checksum {checksum:.9g}")
