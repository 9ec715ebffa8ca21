"""``python -m minicaffe.data mnist [--data-dir D] [--force]``: fetch MNIST ahead of time.

Also ``python -m minicaffe.data list`` (the data source names a prototxt may use) and
``python -m minicaffe.data cifar10 [--data-dir D]`` (check that your CIFAR-10 files are found).
Exit status 0 on success, 1 with one clear message when the data cannot be had.
"""

import argparse
import sys
import time

from . import _util, cifar10, mnist, registry


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minicaffe.data", description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", choices=("mnist", "cifar10", "list"), help="what to fetch or check")
    ap.add_argument(
        "--data-dir",
        help="data / cache directory (default: $MINICAFFE_DATA, "
        "else $XDG_CACHE_HOME/minicaffe, else ~/.cache/minicaffe)",
    )
    ap.add_argument("--force", action="store_true", help="mnist: fetch again even if the cache is intact")
    args = ap.parse_args(argv)
    out = sys.stdout
    try:
        if args.dataset == "list":
            for name, desc in registry.known_sources().items():
                print(f"{name:44s} {desc}", file=out)
            return 0
        if args.dataset == "cifar10":
            for split in ("train", "test"):
                images, labels = cifar10.load(split, args.data_dir)
                print(f"cifar10 {split}: {images.shape[0]} images {images.shape[1:]} uint8", file=out)
            return 0
        t0 = time.perf_counter()
        info = mnist.fetch(args.data_dir, progress=_util.Progress(stream=out, prefix=""), force=args.force)
        print(f"MNIST ready in {time.perf_counter() - t0:.1f} s", file=out)
        if info["source"] == "idx":
            print(f"  source: your IDX files in {info['path']}", file=out)
        else:
            print(f"  cache:  {info['path']}", file=out)
            print(
                f"  cache sha256:  {info['cache_sha256']} (recorded in {info['path']}.json, checked on load)", file=out
            )
            print(f"  wheel  {mnist.WHEEL_REQUIREMENT} sha256: {mnist.WHEEL_SHA256} (pinned)", file=out)
            print(f"  {mnist.PICKLE_MEMBER} sha256: {mnist.PICKLE_SHA256} (pinned)", file=out)
        for split in mnist.SPLITS:
            images, labels = info["arrays"][split]
            counts = " ".join(str(int((labels == k).sum())) for k in range(10))
            print(
                f"  {split}: {images.shape[0]} images {tuple(images.shape[1:])} uint8; per digit 0-9: {counts}",
                file=out,
            )
        return 0
    except _util.DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
