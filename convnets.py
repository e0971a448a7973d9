"""The convolutional networks vision.py compares the ViTs with, hand-written: ResNet-18, DenseNet-121 and ConvMixer
at CIFAR-10 / SVHN size (Fig. 4), and the small Fashion-MNIST CNN (Sec. 5). vision.build_model builds them from its
flags; --input-patch-norm puts vision.PatchNorm in front of the CNN there."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions around a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))  # the residual, added before the last ReLU


class ResNet18(nn.Module):
    """CIFAR ResNet-18: 3x3 stem at stride 1, no max-pool, four stages of two basic blocks."""

    def __init__(self, *, channels, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:  # each stage halves the resolution after the first
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))  # global average pooling


class DenseLayer(nn.Module):
    """DenseNet's bottleneck: BN-ReLU-1x1 conv to 4 * growth channels, BN-ReLU-3x3 conv to growth channels."""

    def __init__(self, cin, growth):
        super().__init__()
        wide = 4 * growth  # the bottleneck's width
        self.net = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, wide, 1, bias=False),
                                 nn.BatchNorm2d(wide), nn.ReLU(), nn.Conv2d(wide, growth, 3, 1, 1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.net(x)], dim=1)  # each layer adds `growth` channels


class DenseNet121(nn.Module):
    """CIFAR DenseNet-121: growth 32, blocks (6, 12, 24, 16), bottlenecks, transitions halving the channels."""

    def __init__(self, *, channels, classes, growth=32, blocks=(6, 12, 24, 16)):
        super().__init__()
        c = 2 * growth
        layers = [nn.Conv2d(channels, c, 3, 1, 1, bias=False)]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i < len(blocks) - 1:  # transition: compress by 2, downsample by 2
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU())
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))  # global average pooling


class ConvMixer(nn.Module):
    """ConvMixer (Trockman & Kolter 2022): patch embedding, then depthwise (spatial) + pointwise (channel) convs."""

    def __init__(self, *, channels, classes, dim, depth, patch, kernel=3):
        super().__init__()
        self.embed = nn.Sequential(nn.Conv2d(channels, dim, patch, stride=patch), nn.GELU(), nn.BatchNorm2d(dim))
        self.spatial = nn.ModuleList([nn.Sequential(nn.Conv2d(dim, dim, kernel, groups=dim, padding="same"),
                                                    nn.GELU(), nn.BatchNorm2d(dim)) for _ in range(depth)])
        self.channel = nn.ModuleList([nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))
                                      for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x)  # (B, dim, H/p, W/p): one "token" per patch, as a feature map
        for spatial, channel in zip(self.spatial, self.channel):
            x = channel(x + spatial(x))  # residual around the depthwise conv only
        return self.head(x.mean((2, 3)))


class CNN(nn.Module):
    """The small Fashion-MNIST CNN: two 3x3 convs (32 channels), a 2x2 max-pool, a 128-unit layer, LeakyReLU after
    each (the paper's text; the authors' ConvNeuralNet has none after the second conv)."""

    def __init__(self, *, channels, size, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.LeakyReLU(), nn.Conv2d(32, 32, 3, padding=1),
                                 nn.LeakyReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * (size // 2) ** 2, 128),
                                 nn.LeakyReLU(), nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x)
