"""Are ImageNet vision transformers less sensitive than ConvNets? (Sec. 5, the pretrained models; nothing is trained.)

Measures torchvision's pretrained ConvNeXt-Tiny and ViT-L/16 on a random subset of an ImageFolder (ImageNet's train
split in the paper) with the token-wise sensitivity of common.py: N(0, sigma^2) on one 16 x 16 patch of the
normalised 224 x 224 image at a time (ViT-L/16's own patch grid, used for both models).

    python imagenet.py --imagenet-dir IMAGENET/train --n-sens 500 --sens-positions 16      # downloads the weights
    python imagenet.py --imagenet-dir IMGS --random-weights --n-sens 2 --sens-positions 2   # offline smoke test
"""

import os

import torch

import report
from common import gaussian, patchify, sensitivity, unpatchify
from runs import (ArgumentParser, Run, add_run_flags, cli, error_line, nonnegative_float, parse, positive_int, seed,
                  setup, start_run, subset_size)

MODELS = ["convnext_tiny", "vit_l_16"]
SWEEP = [0.03, 0.1, 0.3, 1, 3, 10, 30, 100]  # --sweep, as vision.py's


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    g = p.add_argument_group("models and data")
    g.add_argument("--model", type=str, nargs="+", default=MODELS, choices=MODELS, help="torchvision ImageNet models")
    g.add_argument("--imagenet-dir", type=str, default=None, help="an ImageFolder of images (e.g. ImageNet train); "
                   "required")  # (not required=True: --resume FOLDER takes it from the folder's saved flags)
    g.add_argument("--random-weights", action="store_true", help="the models without their weights (no download)")
    g.add_argument("--data-seed", type=seed, default=0, help="seed of the random subset of images")
    g = p.add_argument_group("sensitivity")
    g.add_argument("--sigma", type=nonnegative_float, nargs="+", default=[0.1], help="noise std(s) on the normalised "
                   "pixels; the first is the headline")
    g.add_argument("--sweep", action="store_true", help=f"also measure at sigma in {SWEEP}")
    g.add_argument("--mask", type=str, nargs="+", default=["patch"], choices=["patch", "global"],
                   help="patch: one 16 x 16 patch at a time (Def. 4.1); global: the whole image at once with std "
                   "sigma/sqrt(196) (App. A.2)")
    g.add_argument("--sens-seed", type=seed, default=0, help="seed of the noise (the same for every model: paired)")
    g.add_argument("--reps", type=positive_int, default=1, help="noise draws per (image, patch)")
    g.add_argument("--sens-positions", type=positive_int, default=None, help="sample this many of the 196 patches "
                   "per image and draw, with replacement (default: every patch)")
    g.add_argument("--n-sens", type=positive_int, default=500, help="images the sensitivity is measured on")
    add_run_flags(p, unit="models", default_name="imagenet-pretrained", figures=False)  # it draws none
    args = parse(p, "imagenet", argv)
    if args.imagenet_dir is None:
        p.error("--imagenet-dir is required: a folder of images, one subfolder per class (ImageNet's train split)")
    if not os.path.isdir(args.imagenet_dir):
        p.error(f"--imagenet-dir {args.imagenet_dir}: no such folder")
    return args


def load_images(args, device):
    """A random --n-sens subset of the ImageFolder, resized and centre-cropped to 224 x 224 and normalised with
    ImageNet's mean and std, the models' own; and their class indices."""
    import torchvision
    from torchvision import transforms

    # ImageNet's usual evaluation transform, one for both models so that both see the same pixels (paired); their
    # own torchvision transforms resize to 236 (ConvNeXt-Tiny) and 242 (ViT-L/16) before the same 224 crop
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    try:
        ds = torchvision.datasets.ImageFolder(args.imagenet_dir, transform=tf)
    except (FileNotFoundError, OSError) as e:
        raise FileNotFoundError(f"cannot read images from --imagenet-dir {args.imagenet_dir}: {e}") from None
    n = subset_size("--n-sens", args.n_sens, len(ds), f"images in {args.imagenet_dir}")
    pick = torch.randperm(len(ds), generator=torch.Generator().manual_seed(args.data_seed))[:n].tolist()  # a subset
    images = torch.stack([ds[i][0] for i in pick]).to(device)  # (N, 3, 224, 224), normalised
    labels = torch.tensor([ds[i][1] for i in pick], device=device)
    return images, labels, len(ds.classes)


def load_model(name, random_weights, device):
    import torchvision

    torch.manual_seed(0)  # --random-weights: the same random model in every run (the pretrained ones draw nothing)
    try:
        model = getattr(torchvision.models, name)(weights=None if random_weights else "DEFAULT")
    except Exception as e:  # the weights cannot be downloaded offline, or the file torch.hub keeps is damaged
        url = torchvision.models.get_model_weights(name).DEFAULT.url
        path = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url))
        if os.path.exists(path):
            raise ValueError(f"{path} is present but unreadable ({error_line(e)}); delete it (torchvision then "
                             "downloads it again) or replace it with a good copy") from None
        raise FileNotFoundError(f"cannot get the {name} weights ({type(e).__name__}); with no network put {url} "
                                f"at {path}, or use --random-weights") from None
    return model.to(device).eval()  # eval: no dropout, BatchNorm/LayerNorm statistics fixed


def measure(model, images, args):
    """{"<mask>:<sigma>": Sensitivity} of one model; the same noise (--sens-seed) for every model, so their
    per-image differences are paired."""
    def f(xb, idx):  # the estimator hands patch tokens, the model sees whole images
        return model(unpatchify(xb, 16, images.shape[1:])).float()

    def g(xb, idx):  # one "token" = the whole image
        return model(xb.view(-1, *images.shape[1:])).float()

    tokens = patchify(images, 16)  # (N, 196, 3*16*16): the 14 x 14 grid of 16 x 16 patches
    sigmas = args.sigma + [s for s in SWEEP if s not in args.sigma] if args.sweep else args.sigma
    sens = {}
    for s in sigmas:
        if "patch" in args.mask:
            sens[f"patch:{s:g}"] = sensitivity(f, tokens, gaussian(s), reps=args.reps, positions=args.sens_positions,
                                               seed=args.sens_seed)
        if "global" in args.mask:  # one patch's noise energy (std / sqrt(196)), spread over the whole image
            sens[f"global:{s:g}"] = sensitivity(g, images.flatten(1)[:, None], gaussian(s / 14), reps=args.reps,
                                                seed=args.sens_seed)
    return sens


def main(args):
    device = setup(args)
    images, labels, classes = load_images(args, device)  # before the run folder: a bad folder leaves nothing
    folder, results = start_run("imagenet", args, "imagenet-pretrained", device)
    with results.recording():
        for name in args.model:
            run = Run(name, args.data_seed)  # "seed": the subset of images (--data-seed)
            if results.finished(run):  # --resume: a model measured before the run was stopped
                continue
            model = load_model(name, args.random_weights, device)
            results.progress(run, 0, 0, 1).tick(0, True)  # a line every 20 s; the time is the final measurements'
            final = {}
            if classes == 1000:  # an ImageNet folder: class index = ImageNet label
                with torch.no_grad():
                    final["train_acc"] = (model(images).argmax(1) == labels).float().mean().item()
            sens = measure(model, images, args)
            head = sens[f"{args.mask[0]}:{args.sigma[0]:g}"]  # the headline: first mask, first sigma
            # every measurement with its standard error, and per image for paired differences between the models
            final.update(sens=head.mean, sens_stderr=head.stderr,
                         sens_at={k: {"sens": s.mean, "stderr": s.stderr} for k, s in sens.items()},
                         per_image={k: [round(v, 6) for v in s.per_input.tolist()] for k, s in sens.items()})
            results.final(run, final)
            print(f"{name}: sensitivity {final['sens']:.4f} +- {final['sens_stderr']:.4f} on {len(images)} images")
        # every model against the ViT, per image (the same images and noise): the paper's claim is ViT-L/16 below
        results.data["paired"] = report.vision_paired(results.data)
        results.save()
        report.summary(results.data)
    return results.data


if __name__ == "__main__":
    cli(main, parse_args)
