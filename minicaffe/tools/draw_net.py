"""``python -m minicaffe.draw_net net.prototxt out.png``: a picture of a net's graph (Caffe's
``python/draw_net.py``; drawing in minicaffe/draw.py).

    python -m minicaffe.draw_net nets/lenet_train_test.prototxt lenet.png
    python -m minicaffe.draw_net lenet lenet_train.svg --phase TRAIN --rankdir TB
"""

import argparse
import sys

from ..errors import MinicaffeError
from .common import resolve_net


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.draw_net",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input_net_proto_file", help="a net prototxt, or a short name from nets/ (lenet, ...)")
    p.add_argument("output_image_file", help="the picture to write; its extension picks the format (png, svg, pdf)")
    p.add_argument(
        "--rankdir", default="LR", choices=("LR", "RL", "TB", "BT"), help="direction of the flow (default LR)"
    )
    p.add_argument(
        "--phase",
        default="ALL",
        choices=("TRAIN", "TEST", "ALL"),
        help="draw the layers of this phase only (default ALL: every layer)",
    )
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from ..draw import draw_net_to_file
    from ..net import load_net_param

    try:
        path = resolve_net(args.input_net_proto_file)
        net = load_net_param(path)
        print(f"Drawing net to {args.output_image_file}")
        draw_net_to_file(net, args.output_image_file, args.rankdir, args.phase)
        return 0
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an image format matplotlib cannot write
        print(f"error: {args.output_image_file}: {exc}", file=sys.stderr)
        return 1
