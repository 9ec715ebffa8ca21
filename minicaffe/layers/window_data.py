"""WindowData: windows (boxes) of images, warped to a square crop, for R-CNN fine-tuning (Caffe's
WindowDataLayer, as ``examples/finetune_pascal_detection`` uses it).

    layer { name: "data" type: "WindowData" top: "data" top: "label"
            transform_param { mirror: true crop_size: 227 mean_file: "imagenet_mean.binaryproto" }
            window_data_param { source: "window_file_2007_trainval.txt" batch_size: 128
                                fg_threshold: 0.5 bg_threshold: 0.5 fg_fraction: 0.25
                                context_pad: 16 crop_mode: "warp" } }

The window file, as R-CNN writes it, repeats for each image::

    # <image index>
    <image path>
    <channels>
    <height>
    <width>
    <number of windows>
    <class> <overlap> <x1> <y1> <x2> <y2>      (one line per window, 0-based inclusive pixels)

A window whose overlap >= fg_threshold is foreground (its class, which must be > 0); one below
bg_threshold is background (label 0).  Every batch draws ``batch_size - int(batch_size *
fg_fraction)`` background windows and then the foreground ones, uniformly at random with
replacement; each is expanded by ``context_pad`` pixels of context at the output scale (crop_mode
``square`` first makes it square), clipped to the image, warped (bilinear) to crop_size, mirrored
at random when ``mirror``, placed where the unclipped box would put it (the rest stays 0), then
``(pixel - mean) * scale`` with window_data_param's ``scale``; a mean_file's centre crop_size
square is used, as Caffe.  Tops: data (batch, channels, crop_size, crop_size), label (batch,).

The arithmetic is Caffe's line for line (float rounding of the expanded box included); left out:
``cache_images`` is accepted but images are read from disk each time (a cache of every image
in memory is what it asks for, at the cost of the whole image set in memory), and decoding and
warping use Pillow, not OpenCV (pixels may differ by a level).  The random draws are minicaffe's
seeded stream, so the particular windows differ from Caffe's.
"""

import math

import numpy as np

from ..data import BatchReader, DatasetError, Prefetcher, load_mean_file
from ..data.datum import read_image, resize
from ..layer import register
from .data import DEFAULT_PREFETCH, Data, layer_seed


def parse_window_file(path, root_folder, fg_threshold, bg_threshold):
    """-> (images [(path, (c, h, w))], fg windows (n, 7), bg windows (m, 7)); a window row is
    (image index, label, overlap, x1, y1, x2, y2)."""
    try:
        with open(path, encoding="utf-8") as f:
            tokens = f.read().split()
    except OSError as e:
        raise DatasetError(f"window file '{path}' cannot be read: {e.strerror or e}") from None
    pos, images, fg, bg = 0, [], [], []

    def take(kind, what):
        nonlocal pos
        if pos >= len(tokens):
            raise DatasetError(f"window file '{path}': ends where {what} was expected (image {len(images)})")
        tok = tokens[pos]
        pos += 1
        try:
            return kind(tok)
        except ValueError:
            raise DatasetError(f"window file '{path}': '{tok}' is not {what} (image {len(images)})") from None

    if not tokens:
        raise DatasetError(f"window file '{path}' is empty")
    while pos < len(tokens):
        if take(str, "'#'") != "#":
            raise DatasetError(f"window file '{path}': expected '# <image index>' at image {len(images)}")
        index = take(int, "an image index")
        image_path = root_folder + take(str, "an image path")
        size = (take(int, "channels"), take(int, "height"), take(int, "width"))
        images.append((image_path, size))
        for _ in range(take(int, "a window count")):
            label, overlap = take(int, "a class"), take(float, "an overlap")
            box = [take(int, "a coordinate") for _ in range(4)]
            row = [index, label, overlap, *box]
            if overlap >= fg_threshold:
                if label <= 0:
                    raise DatasetError(
                        f"window file '{path}': a foreground window of image {index} has class {label}; it must be > 0"
                    )
                fg.append(row)
            elif overlap < bg_threshold:
                row[1], row[2] = 0, 0.0
                bg.append(row)
    return images, np.asarray(fg, dtype=np.float64).reshape(-1, 7), np.asarray(bg, dtype=np.float64).reshape(-1, 7)


def _round(x):
    """C's round(): halves away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def place_window(img, box, crop_size, context_pad, square, mirror):
    """Caffe's crop-and-warp of one window -> (warped (C, h, w) uint8, pad_h, pad_w)."""
    f32 = np.float32
    x1, y1, x2, y2 = (int(v) for v in box)
    rows, cols = img.shape[1], img.shape[2]
    pad_w = pad_h = 0
    out_h = out_w = crop_size
    if context_pad > 0 or square:
        context_scale = f32(crop_size) / f32(crop_size - 2 * context_pad)
        half_h, half_w = f32(y2 - y1 + 1) / f32(2.0), f32(x2 - x1 + 1) / f32(2.0)
        cx, cy = f32(x1) + half_w, f32(y1) + half_h
        if square:
            half_h = half_w = max(half_h, half_w)
        x1, x2 = _round(cx - half_w * context_scale), _round(cx + half_w * context_scale)
        y1, y2 = _round(cy - half_h * context_scale), _round(cy + half_h * context_scale)
        unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
        px1, py1 = max(0, -x1), max(0, -y1)
        px2, py2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
        x1, x2, y1, y2 = x1 + px1, x2 - px2, y1 + py1, y2 - py2
        scale_x, scale_y = f32(crop_size) / f32(unclipped_w), f32(crop_size) / f32(unclipped_h)
        out_w = _round(f32(x2 - x1 + 1) * scale_x)
        out_h = _round(f32(y2 - y1 + 1) * scale_y)
        px1, px2 = _round(f32(px1) * scale_x), _round(f32(px2) * scale_x)
        py1 = _round(f32(py1) * scale_y)
        pad_h = py1
        pad_w = px2 if mirror else px1
        out_h = min(out_h, crop_size - pad_h)
        out_w = min(out_w, crop_size - pad_w)
    if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows) or out_h <= 0 or out_w <= 0:
        raise DatasetError(f"window ({x1}, {y1}, {x2}, {y2}) does not fit the image of {cols} x {rows}")
    warped = resize(np.ascontiguousarray(img[:, y1 : y2 + 1, x1 : x2 + 1]), out_h, out_w)
    if mirror:
        warped = warped[:, :, ::-1]
    return warped, pad_h, pad_w


class Windows:
    """The windows of a window file (a data set whose "records" are windows)."""

    def __init__(self, source, param, transform_param):
        self.name = source
        self.images, self.fg, self.bg = parse_window_file(
            source, param.root_folder, param.fg_threshold, param.bg_threshold
        )
        if not len(self.fg) or not len(self.bg):
            raise DatasetError(
                f"window file '{source}': {len(self.fg)} foreground and {len(self.bg)} background windows; "
                f"a batch needs both (check fg_threshold / bg_threshold)"
            )
        self.channels = self.images[0][1][0]

    def __len__(self):
        return len(self.fg) + len(self.bg)


class WindowReader(BatchReader):
    """A batch of windows is drawn at random from a seed and the batch's position."""

    def __init__(self, windows, batch_size, param, transform_param, dtype, seed):
        super().__init__(windows, batch_size, None, shuffle=False, seed=seed, dtype=dtype)
        self.p, self.crop = param, int(transform_param.crop_size)
        self.mirror = bool(transform_param.mirror)
        self.mean_values = [float(v) for v in transform_param.mean_value]
        self.mean = None
        if transform_param.mean_file:
            mean = load_mean_file(transform_param.mean_file).astype(np.float32)
            off = (mean.shape[2] - self.crop) // 2
            if off < 0 or mean.shape[1] - off < self.crop:
                raise DatasetError(f"mean_file {mean.shape} is smaller than crop_size {self.crop}")
            self.mean = mean[:, off : off + self.crop, off : off + self.crop]  # (C, crop, crop)

    def produce(self, epoch, index):
        ds, p, crop = self.dataset, self.p, self.crop
        rng = np.random.default_rng([self.seed, 1, epoch, index])
        num_fg = int(np.float32(self.batch_size) * np.float32(p.fg_fraction))
        c = ds.channels
        data = np.zeros((self.batch_size, c, crop, crop), dtype=np.float32)
        labels = np.zeros(self.batch_size, dtype=self.dtype)
        item = 0
        for windows, count in ((ds.bg, self.batch_size - num_fg), (ds.fg, num_fg)):
            for _ in range(count):
                w = windows[rng.integers(len(windows))]
                do_mirror = self.mirror and bool(rng.integers(2))
                path = ds.images[int(w[0])][0]
                img = read_image(path, is_color=True, where=f"{ds.name} (image {int(w[0])})")
                warped, ph, pw = place_window(img, w[3:7], crop, p.context_pad, p.crop_mode == "square", do_mirror)
                h, wd = warped.shape[1:]
                pix = warped.astype(np.float32)
                if self.mean is not None:
                    pix = pix - self.mean[:, ph : ph + h, pw : pw + wd]
                elif self.mean_values:
                    mv = np.asarray(self.mean_values * (c if len(self.mean_values) == 1 else 1), np.float32)
                    pix = pix - mv[:, None, None]
                data[item, :, ph : ph + h, pw : pw + wd] = pix * np.float32(p.scale)
                labels[item] = w[1]
                item += 1
        idx_after = index + self.batch_size
        after = (epoch + idx_after // len(ds), idx_after % len(ds))
        return data.astype(self.dtype, copy=False), labels, after


@register
class WindowData(Data):
    type = "WindowData"
    min_top, max_top = 2, 2

    def layer_setup(self, bottom, top):
        p, tp = self.param.window_data_param, self.param.transform_param
        if not p.source:
            raise self.error("window_data_param { source: ... } is required (an R-CNN window file)")
        if not p.batch_size:
            raise self.error("window_data_param { batch_size: ... } must be positive")
        if tp.crop_size <= 0:
            raise self.error("transform_param { crop_size: ... } must be positive (the size windows are warped to)")
        if 2 * p.context_pad >= tp.crop_size:
            raise self.error(f"context_pad {p.context_pad} leaves nothing of crop_size {tp.crop_size}")
        if p.crop_mode not in ("warp", "square"):
            raise self.error(f"crop_mode must be 'warp' or 'square', got '{p.crop_mode}'")
        if tp.mean_file and len(tp.mean_value):
            raise self.error("give mean_file or mean_value, not both (Caffe's rule)")
        try:
            self.dataset = Windows(p.source, p, tp)
            if len(tp.mean_value) not in (0, 1, self.dataset.channels):
                raise DatasetError(f"{len(tp.mean_value)} mean_value(s) for {self.dataset.channels} channels")
            reader = WindowReader(self.dataset, int(p.batch_size), p, tp, self.dtype, layer_seed(self.name, self.phase))
        except DatasetError as e:
            raise self.error(str(e)) from None
        self.batch_size = int(p.batch_size)
        self.image_shape = (self.dataset.channels, int(tp.crop_size), int(tp.crop_size))
        self.n_tops = len(top)
        self.prefetcher = Prefetcher(reader, depth=DEFAULT_PREFETCH)
        self.prefetcher.start()
