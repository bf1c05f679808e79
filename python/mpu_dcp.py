"""torch.distributed.checkpoint reads what `mpu ckpt export` writes.

`mpu ckpt export CKPT OUT` writes transformers' sharded layout: files of whole
float32 tensors (model-00001-of-0000N.safetensors) and
model.safetensors.index.json, whose weight_map names each tensor's file.
ExportReader is a StorageReader over that folder (the interface of
torch/distributed/checkpoint/storage.py, as FileSystemReader implements it in
filesystem.py): each tensor is one chunk covering the whole tensor, so DCP's
default planner loads it into any placement (a plain tensor, a DTensor or
FSDP's shards), each rank reading the part of each tensor it holds.

    import torch.distributed.checkpoint as dcp
    from mpu_dcp import ExportReader
    state = {"layers.0.mlp.fc1.weight": torch.empty(64, 16), ...}
    dcp.load(state, storage_reader=ExportReader("OUT"))

Needs torch and safetensors (safetensors.torch.safe_open).
"""
import json
import os

import torch
from safetensors import safe_open
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

INDEX = "model.safetensors.index.json"


class ExportReader(StorageReader):
    """A StorageReader over the folder `mpu ckpt export` wrote."""

    def __init__(self, path):
        super().__init__()
        self.path = os.fspath(path)
        self.weight_map = {}

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return os.path.isfile(os.path.join(os.fspath(checkpoint_id), INDEX))

    def read_metadata(self, *args, **kwargs):
        with open(os.path.join(self.path, INDEX)) as f:
            self.weight_map = json.load(f)["weight_map"]
        state = {}
        for fqn, file in self.weight_map.items():
            with safe_open(os.path.join(self.path, file), framework="pt") as f:
                shape = list(f.get_slice(fqn).get_shape())
            size = torch.Size(shape)
            state[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=torch.float32),
                size=size,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)],
            )
        return Metadata(state_dict_metadata=state)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        if not self.weight_map:
            with open(os.path.join(self.path, INDEX)) as f:
                self.weight_map = json.load(f)["weight_map"]

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        by_file = {}
        for req in plan.items:
            by_file.setdefault(self.weight_map[req.storage_index.fqn], []).append(req)
        for file, reqs in by_file.items():
            with safe_open(os.path.join(self.path, file), framework="pt") as f:
                for req in reqs:
                    if req.type == LoadItemType.BYTE_IO:
                        raise ValueError("%s: the export holds tensors only, not '%s'"
                                         % (self.path, req.storage_index.fqn))
                    tensor = f.get_tensor(req.storage_index.fqn)
                    for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
                        tensor = tensor.narrow(dim, start, length)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != tensor.size():
                        raise ValueError("%s: '%s': a request of %s for a target of %s"
                                         % (self.path, req.storage_index.fqn,
                                            list(tensor.size()), list(target.size())))
                    target.copy_(tensor)
                    planner.commit_tensor(req, target)
        done = Future()
        done.set_result(None)
        return done
