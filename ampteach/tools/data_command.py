"""`ampteach data`: where the lessons' FashionMNIST comes from, and the full download on request.

    $ ampteach data              # which copy the lessons read here
    $ ampteach data download     # fetch the full dataset (about 30 MB, MD5-checked)
"""

from __future__ import annotations

from ampteach.training.data import DatasetNotFoundError, cache_root, describe_source, load_fashion_mnist

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("action", nargs="?", choices=("where", "download"), default="where",
                        help="where: say which copy the lessons read (default); download: fetch the full "
                             "dataset (about 30 MB, MD5-checked) into $AMPTEACH_DATA or the user cache")


def run(args) -> int:
    if args.action == "download":
        try:
            ds = load_fashion_mnist(full=True)
        except DatasetNotFoundError as exc:
            print(exc)
            return 1
        print(f"the full dataset ({len(ds.train_images):,} training + {len(ds.test_images):,} test images) "
              f"is in {ds.root}")
        return 0
    print("load_fashion_mnist() looks, in order, at $AMPTEACH_DATA, the user cache "
          f"({cache_root()}), and the course's split bundled with ampteach.")
    print(f"here it reads {describe_source()}")
    return 0
