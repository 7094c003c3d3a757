"""A stateful batch-normalization layer for training loops, and helpers that
convert running statistics between the TensorFlow, Keras and PyTorch
conventions.

Running statistics: ``moving = momentum * moving + (1 - momentum) * batch``,
with the Bessel-corrected batch variance (TensorFlow's FusedBatchNormV3 with
``exponential_avg_factor = 1 - momentum``).  The frameworks differ in two ways:

============  ===================================  ===========================
convention    momentum weighs                      batch variance
============  ===================================  ===========================
tensorflow    the old value (factor = 1 - m)       Bessel-corrected, n/(n-1)
keras         the old value (factor = 1 - m)       biased (Keras 3, and
                                                   tf.keras' non-fused path)
pytorch       the new batch (factor = m)           Bessel-corrected, n/(n-1)
============  ===================================  ===========================
"""
import numpy as np

from . import _args
from ._args import DTYPES
from ._api import fused_batch_norm, fused_batch_norm_grad

__all__ = ["BatchNorm", "CONVENTIONS", "exponential_avg_factor", "momentum_from_factor",
           "convert_moving_variance"]

#: convention -> (momentum is the new batch's weight?, Bessel-corrected running variance?)
CONVENTIONS = {"tensorflow": (False, True), "keras": (False, False), "pytorch": (True, True)}


def _convention(name, what="convention"):
    try:
        return CONVENTIONS[name]
    except (KeyError, TypeError):
        raise ValueError("%s: expected one of %s, got %r"
                         % (what, ", ".join(CONVENTIONS), name)) from None


def _momentum(momentum):
    # a weight of the running statistics, as exponential_avg_factor is
    return _args.factor(momentum, "momentum")


def _layer_dtype(dtype):
    # np.dtype(None) is float64: a None here is a mistake, not a request for float64.
    expected = "dtype: expected float32, float64, float16 or bfloat16, got %r" % (dtype,)
    if dtype is None:
        raise TypeError(expected)
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise TypeError(expected) from None
    _args.dtype_kinds(dt, "dtype")
    return dt


def _input(a, name):
    if _args.is_cupy(a):
        raise TypeError("%s: got a CuPy array; BatchNorm keeps its parameters and buffers in "
                        "host memory, so it takes NumPy arrays" % name)
    return _args.as_array(a, name)


def _wrong_dtype(a, name, dtype):
    return TypeError("%s: expected the layer's dtype %s, got %s" % (name, dtype, a.dtype))


def exponential_avg_factor(momentum, convention="tensorflow"):
    """The fused op's ``exponential_avg_factor`` for a framework's ``momentum``.

    Keras and TensorFlow layers weigh the old value by momentum (0.99 means
    a factor of 0.01); PyTorch weighs the new batch by it (0.1 means 0.1).
    """
    new_weight, _ = _convention(convention)
    m = _momentum(momentum)
    return m if new_weight else 1.0 - m


def momentum_from_factor(factor, convention="tensorflow"):
    """The inverse of `exponential_avg_factor`: a framework's momentum."""
    return exponential_avg_factor(factor, convention)


def convert_moving_variance(variance, count, source, target):
    """A running variance kept in the `source` convention, in the `target` one.

    Parameters
    ----------
    variance : array_like
        The running variance.
    count : int
        Elements per channel of each training batch (N*H*W), the n of the
        Bessel factor n/(n - 1); taken as 1 when n = 1, as the fused op does.
    source, target : {"tensorflow", "keras", "pytorch"}

    Returns
    -------
    ndarray
        ``variance`` times (n-1)/n (Bessel-corrected to biased), n/(n-1)
        (biased to corrected), or unchanged.

    Notes
    -----
    Exact for every batch's contribution when all batches have `count`
    elements; the initial value's remaining weight (momentum**steps for the
    old-value conventions) is scaled too, which is negligible after a few
    hundred steps, and exact when the running variance started at zero.
    """
    _, bessel_from = _convention(source, "source")
    _, bessel_to = _convention(target, "target")
    v = np.asarray(variance)
    n = _args.index(count, "count")
    if n < 1:
        raise ValueError("count: expected at least 1, got %r" % (count,))
    ratio = n / (n - 1) if n > 1 else 1.0
    if bessel_from and not bessel_to:
        return v / ratio
    if bessel_to and not bessel_from:
        return v * ratio
    return v.copy()


class BatchNorm:
    """Batch normalization with its parameters and running statistics.

    Parameters
    ----------
    num_features : int
        Channels C, at least 1.
    data_format : {"NHWC", "NCHW", "NDHWC", "NCDHW", "NC"}
    epsilon : float
        Added to the variance before the square root; finite, >= 0.
    momentum : float
        Weight of the old running value (Keras/TensorFlow meaning):
        ``moving = momentum * moving + (1 - momentum) * batch``, with the
        Bessel-corrected batch variance.  For a PyTorch momentum p use
        ``1 - p``; see `convert_moving_variance` for Keras' biased variance.
    activation : str, optional
        Fused activation, as for `cfbn.fused_batch_norm`.
    dtype : numpy dtype
        Dtype of the inputs: float32, float64, float16 or bfloat16
        (``ml_dtypes.bfloat16``); the parameters of the last two are float32.
    buffer_shapes : int
        How many input shapes keep their output buffers, the most recently
        used ones (the default 4 covers a training shape, a last partial
        batch and a validation shape or two); 0 makes every call return new
        arrays.

    Every argument is checked here, with an error naming it.

    Attributes
    ----------
    num_features, data_format, dtype, buffer_shapes
        As constructed; read-only (the parameters' shape and dtype depend on
        the first three).
    epsilon, momentum, activation
        As constructed; assigning them checks the new value as the
        constructor does.
    scale, offset, moving_mean, moving_variance : ndarray
        Length-C parameters (ones, zeros) and running statistics (zeros,
        ones); updated in place, so references to them stay valid.
    scale_grad, offset_grad : ndarray
        Gradients of the last `backward` call.
    side_input_grad : ndarray or None
        The side input's gradient, when the forward the last `backward`
        differentiated had a side input.
    training : bool
        The mode `forward` uses when not told; see `train` and `eval`.
        Only a bool (or NumPy bool) can be assigned.

    Notes
    -----
    `backward` differentiates the last `forward`, with one exception: an
    inference call (``training=False``, or the layer in `eval` mode) made
    after a training forward and before that forward's `backward`, such as
    a validation pass in the middle of a step, leaves the training step's
    state alone, and `backward` still differentiates the training forward.
    Once that backward has run, the next inference call is the one
    `backward` differentiates (frozen statistics, as when fine-tuning with
    the layer in eval mode).  `backward` reads the x (and side input) of
    the forward it differentiates, which must not be modified in between.

    After the first call for a given input shape a training step allocates
    no arrays.  `forward` returns y in a buffer the layer reuses for the
    next forward of the same shape and mode (training and inference calls
    have a buffer each, so a validation call leaves the training y alone),
    and `backward` returns dx (and side_input_grad) in buffers reused by
    the next backward of that shape: copy a result to keep it past the next
    such call.  The buffers of at most `buffer_shapes` shapes are kept, the
    least recently used dropped first, and `release_buffers` drops them
    all.  A dropped array is never written again: one a caller still holds
    keeps its values (a pending backward whose shape was dropped returns
    dx in a new array).
    """

    def __init__(self, num_features, *, data_format="NHWC", epsilon=1e-3, momentum=0.99,
                 activation=None, dtype=np.float32, buffer_shapes=4):
        c = _args.index(num_features, "num_features")
        if c < 1:
            raise ValueError("num_features: expected at least 1, got %d" % c)
        _args.format_spec(data_format)
        self._dtype = _layer_dtype(dtype)
        n = _args.index(buffer_shapes, "buffer_shapes")
        if n < 0:
            raise ValueError("buffer_shapes: expected 0 or more, got %d" % n)
        self._buffer_shapes = n
        self._num_features = c
        self._data_format = data_format
        self.epsilon = epsilon
        self.momentum = momentum
        self.activation = activation
        self._training = True
        vdt = DTYPES[self._dtype][1]
        self.scale = np.ones(c, vdt)
        self.offset = np.zeros(c, vdt)
        self.moving_mean = np.zeros(c, vdt)
        self.moving_variance = np.ones(c, vdt)
        self.scale_grad = np.zeros(c, vdt)
        self.offset_grad = np.zeros(c, vdt)
        self.side_input_grad = None
        # The reserve spaces of the last training forward and of the last inference
        # call apart, so that a validation call cannot clobber a pending backward's.
        self._batch_mean = np.zeros(c, vdt)
        self._batch_variance = np.zeros(c, vdt)
        self._eval_mean = np.zeros(c, vdt)
        self._eval_variance = np.zeros(c, vdt)
        # where an inference call puts its batch_mean and batch_variance, which are
        # not the running statistics there (NaN for an empty batch, as TensorFlow)
        self._eval_stats = (np.zeros(c, vdt), np.zeros(c, vdt))
        # shape -> [training y, inference y, dx, side input grad], each made when first
        # needed; in least recently used order, and the most recent one also apart, so that
        # a loop over one shape finds it with one comparison.
        self._buffers = {}
        self._recent_shape = None
        self._recent = None
        # (x, side_input, training, mean, variance, buffers) of the forward backward uses
        self._grad_state = None
        self._step_open = False     # a training forward awaits its backward

    # The per-call paths read the private attributes, already checked, so that a
    # training step pays for no property lookups.
    num_features = property(lambda self: self._num_features, doc="Channels C (read-only).")
    data_format = property(lambda self: self._data_format, doc="The layout (read-only).")
    dtype = property(lambda self: self._dtype, doc="Dtype of the inputs (read-only).")
    buffer_shapes = property(lambda self: self._buffer_shapes,
                             doc="How many input shapes keep their buffers (read-only).")

    @property
    def epsilon(self):
        """Added to the variance before the square root (a float >= 0)."""
        return self._epsilon

    @epsilon.setter
    def epsilon(self, value):
        self._epsilon = _args.epsilon(value)

    @property
    def momentum(self):
        """Weight of the old running value, in [0, 1]."""
        return self._momentum

    @momentum.setter
    def momentum(self, value):
        self._momentum = m = _momentum(value)
        self._factor = 1.0 - m

    @property
    def activation(self):
        """The fused activation's name, or None."""
        return self._activation

    @activation.setter
    def activation(self, value):
        _args.activation(value, None)
        self._activation = value

    @property
    def training(self):
        """The mode `forward` uses when not told (a bool)."""
        return self._training

    @training.setter
    def training(self, value):
        self._training = _args.flag(value, "training")

    def train(self, mode=True):
        """Use batch statistics (and update the running ones) by default.

        Parameters
        ----------
        mode : bool
            True for training, False for inference (as `eval`).

        Returns
        -------
        BatchNorm
            self.
        """
        self._training = _args.flag(mode, "mode")
        return self

    def eval(self):
        """Use the running statistics by default; returns self."""
        return self.train(False)

    def _check_shape(self, x):
        _, _, channels, _ = _args.layout(self._data_format, x)
        if channels != self._num_features:
            raise ValueError("x: expected %d channels (num_features) on axis %d for data_format "
                             "%r, got shape %s" % (self._num_features,
                                                   self.channel_axis(x.ndim), self._data_format,
                                                   x.shape))

    def _bufs(self, x):
        """The buffer set of x's shape (not the most recent one), made most recent."""
        shape = x.shape
        sets = self._buffers
        bufs = sets.pop(shape, None)
        if bufs is None:
            self._check_shape(x)
            bufs = [None, None, None, None]
            if not self._buffer_shapes:
                return bufs
            if len(sets) >= self._buffer_shapes:
                self._drop(next(iter(sets)))
        sets[shape] = bufs
        self._recent_shape, self._recent = shape, bufs
        return bufs

    def _drop(self, shape):
        # Dropped, never recycled nor written again: a caller may still hold these arrays.
        # A pending backward of that shape gets a set of its own for its dx.
        dropped = self._buffers.pop(shape)
        state = self._grad_state
        if state is not None and state[5] is dropped:
            self._grad_state = state[:5] + ([None, None, None, None],)

    def release_buffers(self):
        """Drop the output buffers and what the layer keeps for `backward`.

        Frees the per-shape y, dx and side-input-gradient buffers and the
        references to the last forward's x and side input; arrays a caller
        holds stay valid, and the layer never writes them again.  The next
        call allocates afresh; `backward` needs a `forward` first.
        """
        self._buffers = {}
        self._recent_shape = self._recent = None
        self._grad_state = None
        self._step_open = False
        self.side_input_grad = None

    def forward(self, x, training=None, side_input=None):
        """Normalize `x` (and apply the side input and activation).

        Parameters
        ----------
        x : ndarray
            Input of the layer's dtype, laid out as its data_format, with
            num_features channels.
        training : bool, optional
            Batch statistics and a running-statistics update (True) or the
            running statistics (False); None uses the layer's mode.
        side_input : ndarray, optional
            Added before the activation (a residual branch).

        Returns
        -------
        ndarray
            y, in a buffer the layer reuses for the next forward of this
            shape and mode.

        Raises
        ------
        TypeError
            x is not an array of the layer's dtype, or training is not a bool.
        ValueError
            x's rank or channel count does not fit data_format and
            num_features.
        """
        if type(x) is not np.ndarray:
            x = _input(x, "x")
        if x.dtype is not self._dtype and x.dtype != self._dtype:
            raise _wrong_dtype(x, "x", self._dtype)
        if training is None:
            training = self._training
        elif training is not True and training is not False:
            training = _args.flag(training, "training")
        shape = x.shape
        bufs = self._recent if shape == self._recent_shape else self._bufs(x)
        if training:
            y = bufs[0]
            mean, variance = self._batch_mean, self._batch_variance
        else:
            y = bufs[1]
            mean, variance = self._eval_mean, self._eval_variance
        if y is None:
            y = bufs[0 if training else 1] = np.empty(shape, self._dtype)
        if training:
            out = (y, self.moving_mean, self.moving_variance, mean, variance)
        else:
            out = (y, self._eval_stats[0], self._eval_stats[1], mean, variance)
        fused_batch_norm(x, self.scale, self.offset, self.moving_mean, self.moving_variance,
                         epsilon=self._epsilon, exponential_avg_factor=self._factor,
                         data_format=self._data_format, is_training=training, out=out,
                         activation=self._activation, side_input=side_input)
        if training:
            self._grad_state = (x, side_input, True, mean, variance, bufs)
            self._step_open = True
        elif not self._step_open:
            self._grad_state = (x, side_input, False, mean, variance, bufs)
        return y

    __call__ = forward

    def backward(self, dy):
        """Gradient of the forward call described in the class Notes (the last
        one, or the training forward a validation call came after).

        Parameters
        ----------
        dy : ndarray
            Gradient of the loss with respect to that forward's y: its
            shape, the layer's dtype.

        Returns
        -------
        ndarray
            dx, in a buffer the layer reuses for the next backward of this
            shape.  scale_grad and offset_grad are set (and side_input_grad
            when that forward had a side input).

        Raises
        ------
        RuntimeError
            No forward call to differentiate.
        TypeError, ValueError
            dy is not an array of the layer's dtype and the forward's shape.
        """
        state = self._grad_state
        if state is None:
            raise RuntimeError("backward: no forward call to differentiate; call forward first")
        x, side, training, mean, variance, bufs = state
        if type(dy) is not np.ndarray:
            dy = _input(dy, "dy")
        if dy.dtype is not self._dtype and dy.dtype != self._dtype:
            raise _wrong_dtype(dy, "dy", self._dtype)
        if dy.shape != x.shape:
            raise ValueError("dy: expected the shape of the forward's x, %s, got %s"
                             % (x.shape, dy.shape))
        dx = bufs[2]
        if dx is None:
            dx = np.empty(x.shape, self._dtype)
            if self._buffer_shapes:
                bufs[2] = dx
        if side is None:
            sg = None
            out = (dx, self.scale_grad, self.offset_grad)
        else:
            sg = bufs[3]
            if sg is None:
                sg = np.empty(x.shape, self._dtype)
                if self._buffer_shapes:
                    bufs[3] = sg
            out = (dx, self.scale_grad, self.offset_grad, sg)
        fused_batch_norm_grad(dy, x, self.scale, mean, variance,
                              epsilon=self._epsilon, data_format=self._data_format,
                              is_training=training, out=out, offset=self.offset,
                              activation=self._activation, side_input=side)
        self._step_open = False
        self.side_input_grad = sg
        return dx

    def batch_count(self, x):
        """Elements per channel of `x` (the n of the Bessel factor)."""
        shape = np.shape(x)
        n = 1
        for a in _args.reduce_axes(self._data_format, len(shape)):
            n *= shape[a]
        return n

    def channel_axis(self, ndim):
        """The channel axis of a tensor of `ndim` dimensions in this layer's layout."""
        return _args.channel_axis(self._data_format, ndim)
