"""torch-sharded's weights: each process keeps its own slice of each large
trainable weight between steps, and the weight is whole only while
something computes with it, as FSDP (ZeRO stage 3) does.

A split weight's Keras variable keeps its torch parameter (the one Keras's
layers, torch's module and DistributedDataParallel know), but the
parameter's storage is freed at rest; this process's slice lives in a
tensor of its own (`Held.part`), which the optimizer updates
(engines/torch/optimizer_shards.py). Reading the variable (Keras's ops
do, through `variable.value`) gathers the slices into the parameter first:
one all_gather, on a process group of the weights' own. Around each
training step:

- a layer's call reads its weights, whole for that call; when the call
  ends they are freed again;
- what backward needs of a weight is not kept by autograd: a saved-tensor
  hook keeps a token, and backward gathers the weight again when it gets
  there, and frees it once the weight's gradient is accumulated;
- the gradients stay whole (DistributedDataParallel averages them as in
  torch-ddp); the optimizer updates each process's slices of them, and the
  weights, whole anywhere, are freed.

An assign (a load, `set_weights`, a constraint) writes the whole weight and
this process's slice, with no exchange. Every read outside a step (a save,
`evaluate`, `predict`, a callback) gathers: every process must read (the
programs agnostic runs do: each process runs the same script). The
variable's class becomes a subclass of its own on this instance only,
whose `value` and `_direct_assign` do the above; compiling again puts it
back.
"""
import contextlib
import weakref

from agnostic import errors, methods
from agnostic.compat import torch_variables
from agnostic.engines.torch import optimizer_shards as shards

# The weights' key in a model's __dict__ (out of Keras's tracking).
KEY = "_agnostic_weight_shards"
INDEX_BYTES = 8  # each gathered slice ends with its weight's index, an int64


def of(model, rank, world):
    """`model`'s Weights, splitting its large trainable weights over `world`
    processes (every process calls this at the same point: it makes a
    process group)."""
    undo(model)
    made = model.__dict__[KEY] = Weights(model, rank, world)
    # Compiling again makes every weight whole and plain first.
    model.__dict__.setdefault(methods.UNDO, methods.Held([])).values.append(
        lambda: undo(model))
    return made


def undo(model):
    """Every weight of `model` whole again, as Keras made it (compiling again)."""
    made = model.__dict__.pop(KEY, None)
    if made is not None:
        made.undo()


class Held:
    """One split weight: its variable, its Split, and this process's slice."""

    def __init__(self, weights, variable, split, index):
        import torch

        self.weights, self.variable, self.split = weights, variable, split
        self.index = index  # its place among the split weights, the same everywhere
        self.parameter = torch_variables.parameter(variable)
        self.bytes = self.parameter.numel() * self.parameter.element_size()
        flat = self.parameter.data.view(-1)
        self.part = split.of(flat, weights.rank).clone()
        self.whole = True
        with torch.no_grad():
            self.hook = self.parameter.register_post_accumulate_grad_hook(self._grad_done)

    def storage(self):
        return self.parameter.data.untyped_storage()

    def gather(self):
        """The whole weight in the parameter: one all_gather of the slices,
        each sent with the weight's index, checked (a process reading
        another weight, or none, is named rather than mixed in)."""
        if self.whole:
            return
        import torch
        import torch.distributed as dist

        self._allocate()
        weights = self.weights
        with torch.no_grad():
            flat = self.parameter.data.view(-1)
            values = shards.padded([self.part], max(self.split.counts))
            index = torch.tensor([self.index], dtype=torch.int64, device=values.device)
            # As bytes: the index exact whatever the weight's dtype (bfloat16's
            # whole numbers stop at 256).
            send = torch.cat([values.view(torch.uint8), index.view(torch.uint8)])
            received = [torch.empty_like(send) for _ in range(weights.world)]
            dist.all_gather(received, send, group=weights.group)
            for rank, raw in enumerate(received):
                sent = int(raw[-INDEX_BYTES:].view(torch.int64))
                if sent != self.index:
                    raise weights.mismatched(self, rank, sent)
                part = raw[:-INDEX_BYTES].view(values.dtype)[:self.split.counts[rank]]
                self.split.of(flat, rank).copy_(part)
        weights.gathers += 1

    def wanted(self, reader):
        """A read of the variable by the code of frame `reader`: the whole
        weight, gathered if freed; not where, after backward and before the
        update, Keras's trainer reads it for its .grad (its values then are
        read by nothing: a read of a freed weight's values would crash)."""
        if self.whole or (self.weights.after_backward
                          and torch_variables.reads_only_gradients(reader)):
            return
        self.gather()

    def _allocate(self):
        self.storage().resize_(self.bytes)
        self.whole = True
        self.weights.by_storage[self.storage().data_ptr()] = self

    def free(self):
        if not self.whole:
            return
        self.weights.by_storage.pop(self.storage().data_ptr(), None)
        if not self.storage().resizable():
            # A NumPy array read it (Keras's numpy(), a save) and keeps that
            # storage: the parameter takes a storage of its own.
            import torch

            self.parameter.data = torch.empty_like(self.parameter.data)
        self.storage().resize_(0)
        self.whole = False

    def assigned(self, direct_assign, value):
        """Keras's assign, into the whole weight (allocated, not gathered:
        every value is written) and this process's slice."""
        import torch

        if not self.whole:
            self._allocate()
        direct_assign(value)
        with torch.no_grad():
            self.part.copy_(self.split.of(self.parameter.data.view(-1), self.weights.rank))

    def _grad_done(self, parameter):
        # Backward is done with this weight (its gradient is whole in .grad).
        weights = self.weights
        if weights.in_step:
            weights.after_backward = True
            self.free()


class Weights:
    """A model's split weights, and the hooks that gather and free them."""

    def __init__(self, model, rank, world):
        import torch.distributed as dist

        self.model, self.rank, self.world = model, rank, world
        self.group = dist.new_group(list(range(world)))
        self.held = {}  # id(variable): Held
        self.by_storage = {}  # the data pointer of each whole weight's storage: its Held
        self.in_step = False  # in a training step: calls free what they gathered
        self.after_backward = False  # reads of freed weights want their .grad
        self.gathers = 0  # read by tests and benchmarks
        self.handles = []
        for variable in model.trainable_weights:
            value = torch_variables.parameter(variable)
            if (id(variable) in self.held or value is None or value.numel() < shards.SMALLEST
                    or not value.is_contiguous()):
                continue
            held = Held(self, variable, shards.Split(value.numel(), world), len(self.held))
            self.held[id(variable)] = held
            self.by_storage[held.storage().data_ptr()] = held
            torch_variables.intercept(variable, held)
        self._hook_layers(model)

    def _hook_layers(self, model):
        ref = weakref.ref(self)

        def began(layer, args):
            weights = ref()
            if weights is not None:
                weights.after_backward = False

        def ended(layer, args, outputs):
            weights = ref()
            own = layer.__dict__.get("_agnostic_own_held", ())
            if weights is None or not weights.in_step or not own:
                return
            # An output that is a view of a weight (a position embedding's
            # slice of its table) keeps that weight whole until the update.
            viewed = {tensor.untyped_storage().data_ptr()
                      for tensor in _tensors(outputs)}
            weights.free([held for held in own
                          if held.storage().data_ptr() not in viewed])

        for layer in torch_variables.layers(model):
            own = [self.held[id(v)] for v in torch_variables.own_variables(layer)
                   if id(v) in self.held]
            if own or layer is model:
                layer.__dict__["_agnostic_own_held"] = own
                self.handles += [layer.register_forward_pre_hook(began),
                                 layer.register_forward_hook(ended)]

    def mismatched(self, held, rank, index):
        """The error of a gather where process `rank` sent weight `index`."""
        named = [one.variable.path for one in self.held.values() if one.index == index]
        other = repr(named[0]) if named else f"weight number {index}"
        return errors.AgnosticError(
            f"Process {self.rank} read weight {held.variable.path!r} during fit while "
            f"process {rank} read {other}: under shard=True each process holds a slice of "
            "each large weight, and a read during fit gathers it from every process, so "
            "every process must read the same weights in the same order (the same script "
            "on every process does). Read weights on every process, or after fit, where "
            f"they are whole. Received: {other} from process {rank}")

    def holds(self, variable):
        return self.held.get(id(variable))

    def free(self, held=None):
        for one in (self.held.values() if held is None else held):
            one.free()

    @contextlib.contextmanager
    def whole(self):
        """Within: every split weight whole; those that were not are freed
        after (every process must enter, in the same order: each is
        gathered)."""
        gathered = [held for held in self.held.values() if not held.whole]
        for held in gathered:
            held.gather()
        try:
            yield
        finally:
            self.free(gathered)

    def gather(self):
        """Every split weight whole (every process calls it, at the same point)."""
        for held in self.held.values():
            held.gather()

    @contextlib.contextmanager
    def step(self):
        """A training step: what autograd keeps of a split weight is a token,
        gathered again in backward."""
        import torch

        self.in_step, self.after_backward = True, False
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            self.in_step, self.after_backward = False, False

    def _pack(self, tensor):
        held = self.by_storage.get(tensor.untyped_storage().data_ptr())
        return tensor if held is None else _Token(held, tensor)

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, _Token):
            packed.held.gather()
            return packed.tensor
        return packed

    def undo(self):
        """Every weight whole and plain again (every process calls it)."""
        for held in self.held.values():
            held.gather()
            held.hook.remove()
            torch_variables.release(held.variable)
        for handle in self.handles:
            handle.remove()
        for layer in torch_variables.layers(self.model):
            layer.__dict__.pop("_agnostic_own_held", None)
        self.held, self.handles = {}, []


def _tensors(outputs):
    import keras
    import torch

    return [value for value in keras.tree.flatten(outputs) if torch.is_tensor(value)]


class _Token:
    __slots__ = ("held", "tensor")

    def __init__(self, held, tensor):
        self.held, self.tensor = held, tensor
