"""DistributedDataParallel training on the CPU with cfbn.torch.SyncBatchNorm.

Each rank (this file run as a script; see _ranks.py) wraps the same model
in DDP over gloo and takes SGD steps on its shard of a batch; after every
step its parameters, gradients and running statistics must be those of one
process training an equivalent torch.nn model (nn.BatchNorm2d and the
activation as its own module) on the whole batch.
"""
import sys

import _ranks

STEPS = 2
LR = 0.1


def _models(torch):
    """(the model DDP wraps, its torch.nn twin with the same values)."""
    import cfbn.torch as ct
    nn = torch.nn
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(2, 3, 1), nn.Conv2d(3, 2, 1)
    bn1 = ct.SyncBatchNorm(3, activation="silu")
    # the cumulative average, and affine parameters away from 1 and 0
    bn2 = ct.SyncBatchNorm(2, momentum=None)
    with torch.no_grad():
        bn2.weight.uniform_(0.5, 2.0)
        bn2.bias.uniform_(-1.0, 1.0)
    model = nn.Sequential(conv1, bn1, conv2, bn2).double()
    twin = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.SiLU(), nn.Conv2d(3, 2, 1),
                         nn.BatchNorm2d(2, momentum=None)).double()
    for mine, theirs in zip(model, (twin[0], twin[1], twin[3], twin[4])):
        theirs.load_state_dict(mine.state_dict())
    return model, twin


def _twin_name(name):
    # the twin's indices after the activation module it adds
    return {"2": "3", "3": "4"}.get(name[0], name[0]) + name[1:]


def _close(a, b, what):
    import torch
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: what + ": " + m)


def _worker(rank, world, store, sizes):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _ranks.init(rank, world, store)
    sizes = [int(s) for s in sizes.split(",")]
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    model, twin = _models(torch)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x = torch.randn(sum(sizes), 2, 3, 2, generator=gen, dtype=torch.float64) * 2 + 1
        g = torch.randn(sum(sizes), 2, 3, 2, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        twin_opt.zero_grad()
        # DDP averages the ranks' gradients; world * this shard's part of
        # the loss makes that average the whole batch's gradient however
        # uneven the shards are.
        (ddp(x[lo:hi]) * g[lo:hi]).sum().mul(world).backward()
        (twin(x) * g).sum().backward()
        named = dict(twin.named_parameters())
        for name, p in model.named_parameters():
            _close(p.grad, named[_twin_name(name)].grad, "step %d: %s.grad" % (step, name))
        opt.step()
        twin_opt.step()
        state = twin.state_dict()
        for name, p in model.state_dict().items():
            _close(p, state[_twin_name(name)], "step %d: %s" % (step, name))
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_step_two_ranks_uneven(tmp_path):
    _ranks.run(__file__, tmp_path, 2, "3,5")


def test_ddp_step_three_ranks_with_an_empty_shard(tmp_path):
    _ranks.run(__file__, tmp_path, 3, "4,0,3")


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
