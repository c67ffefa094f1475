"""Building blocks for libraries that make their own transfers out of tensor handles.

Weight sync (`Publisher`, `Subscriber`, `pull`) and raw handles (`share`, `read_into`) need
none of this. A library that plans its own reads on `TensorHandle`s, as `dtensor-reshard`
does, uses it to copy straight out of a same-machine owner's memory:

    from rdma_tensor.lowlevel import check_owner, choose_transport, local_tensor

    if choose_transport(handle) is not Transport.RDMA:   # the owner is on this machine
        check_owner(handle.owner)                        # closed or dead: raises now
        flat = local_tensor(handle)                      # the owner's memory, no copy

- `choose_transport(handle, requested=None)`: the transport a read from this process uses.
- `local_tensor(handle, transport=None)`: the owner's memory itself as a flat tensor, on the
  owner's machine only (read-only for shared memory).
- `check_owner(owner)`: raises `PublisherClosedError` / `PublisherDiedError` if a
  same-machine owner closed its memory or died.
- `transport_override(explicit=None, *, device=None)`: the forced transport (the argument,
  else the `ENV_VAR` environment variable, `RDMA_TENSOR_TRANSPORT`), or None.

`choose_transport` decides "the owner's machine" with `rdma_tensor.machine.same_machine` on
the owner's `Machine` (in `handle.owner.process.machine`) and this process's
(`this_machine()`), so a library built on it follows `RDMA_TENSOR_MACHINE_ID` for free.
"""

from rdma_tensor.handle import check_owner, choose_transport, local_tensor
from rdma_tensor.transport import ENV_VAR, transport_override

__all__ = ["ENV_VAR", "check_owner", "choose_transport", "local_tensor", "transport_override"]
