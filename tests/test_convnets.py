"""convnets.py: the CIFAR ResNet-18 and DenseNet-121 against torchvision's parameter counts (with a 3x3 stem), the
ConvMixer and the small CNN against theirs by hand, every forward pass against its parts, and the feature maps'
resolutions."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from convnets import CNN, BasicBlock, ConvMixer, DenseLayer, DenseNet121, ResNet18


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_resnet18_and_densenet121_are_torchvisions_with_a_cifar_stem():
    """The CIFAR versions (the authors' code: a 3x3 stem at stride 1, no max-pool) differ from torchvision's ImageNet
    models only in the stem: a 3x3 convolution to 64 channels in place of the 7x7 one (and, for DenseNet, no
    BatchNorm after it): 11,173,962 and 6,956,298 parameters for 10 classes."""
    resnet = count(torchvision.models.resnet18(num_classes=10)) - 64 * 3 * 7 * 7 + 64 * 3 * 3 * 3
    densenet = count(torchvision.models.densenet121(num_classes=10)) - 64 * 3 * 7 * 7 - 2 * 64 + 64 * 3 * 3 * 3
    assert count(ResNet18(channels=3, classes=10)) == resnet == 11_173_962
    assert count(DenseNet121(channels=3, classes=10)) == densenet == 6_956_298


def test_convmixer_and_cnn_parameters_by_hand():
    """ConvMixer: a p x p patch embedding, then per layer a depthwise k x k and a pointwise convolution, each with a
    bias and a BatchNorm; the CNN: two 3x3 convolutions of 32 channels, a 128-unit layer, the classifier."""
    dim, depth, p, k = 16, 3, 4, 5
    mixer = 3 * dim * p * p + dim + 2 * dim + depth * (dim * k * k + dim + 2 * dim + dim * dim + dim + 2 * dim)
    assert count(ConvMixer(channels=3, classes=10, dim=dim, depth=depth, kernel=k, patch=p)) == mixer + dim * 10 + 10
    cnn = 32 * 9 + 32 + 32 * 32 * 9 + 32 + 32 * 14 * 14 * 128 + 128 + 128 * 10 + 10
    model = CNN(channels=1, size=28, classes=10)
    assert count(model) == cnn
    assert sum(isinstance(m, nn.LeakyReLU) for m in model.modules()) == 3  # after each layer but the classifier


def test_every_forward_pass_is_its_parts():
    """Residual blocks add their shortcut before the last ReLU (a strided 1x1 convolution where the shape changes); a
    dense layer appends its new channels after its input, and DenseNet's transitions average-pool; ConvMixer embeds its
    patches with a GELU before the BatchNorm, as each of its layers does after its convolution, and adds the residual
    around the depthwise convolution only; the heads read the global average of the last feature map, 4 x 4 at 32 x 32
    for ResNet and DenseNet, whose stems keep the 32 x 32, and DenseNet's features end with a BatchNorm, then a ReLU."""
    torch.manual_seed(0)
    x = torch.randn(2, 64, 8, 8)

    def randomised(m):  # BatchNorm statistics away from 0 and 1, so that the parts' order shows
        for b in m.modules():
            if isinstance(b, nn.BatchNorm2d):
                b.running_mean.normal_()
                b.running_var.uniform_(0.5, 2)
                b.weight.data.normal_()
                b.bias.data.normal_()
        return m.eval()

    with torch.no_grad():
        for cout, stride in [(64, 1), (128, 2)]:
            b = randomised(BasicBlock(64, cout, stride))
            if stride == 1:
                assert len(b.shortcut) == 0  # the identity
            else:
                assert isinstance(b.shortcut[0], nn.Conv2d) and b.shortcut[0].stride == (2, 2)
            want = F.relu(b.bn2(b.conv2(F.relu(b.bn1(b.conv1(x))))) + b.shortcut(x))
            assert torch.equal(b(x), want) and want.shape == (2, cout, 8 // stride, 8 // stride)
        wider = BasicBlock(64, 96, 1)  # the channels change at stride 1: a 1x1 projection all the same
        assert isinstance(wider.shortcut[0], nn.Conv2d) and wider.eval()(x).shape == (2, 96, 8, 8)
        d = randomised(DenseLayer(64, 8))
        assert torch.equal(d(x), torch.cat([x, d.net(x)], dim=1))
        assert [type(m) for m in d.net] == [nn.BatchNorm2d, nn.ReLU, nn.Conv2d] * 2  # pre-activation, as torchvision's

        img = torch.randn(2, 3, 32, 32)
        resnet = randomised(ResNet18(channels=3, classes=10))
        assert resnet.stem(img).shape == (2, 64, 32, 32)  # the stem keeps the resolution (padded, stride 1)
        assert [type(m) for m in resnet.stem] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU]  # torchvision's conv1, bn1, relu
        features = resnet.blocks(resnet.stem(img))
        assert features.shape == (2, 512, 4, 4)
        assert torch.allclose(resnet(img), resnet.head(features.mean((2, 3))), atol=1e-5)
        densenet = randomised(DenseNet121(channels=3, classes=10))
        assert densenet.features[0](img).shape == (2, 64, 32, 32)
        features = densenet.features(img)
        assert features.shape == (2, 1024, 4, 4)
        assert [type(m) for m in densenet.features[-2:]] == [nn.BatchNorm2d, nn.ReLU]  # torchvision's norm5, then ReLU
        assert features.min() >= 0
        pools = [m for m in densenet.features if isinstance(m, (nn.AvgPool2d, nn.MaxPool2d))]
        assert [type(m) for m in pools] == [nn.AvgPool2d] * 3  # the transitions average, as torchvision's
        assert torch.allclose(densenet(img), densenet.head(features.mean((2, 3))), atol=1e-5)

        mixer = randomised(ConvMixer(channels=3, classes=10, dim=16, depth=2, patch=4))
        h = mixer.embed(img)
        assert h.shape == (2, 16, 8, 8)
        assert torch.equal(h, mixer.embed[2](F.gelu(mixer.embed[0](img))))  # patches, GELU, then BatchNorm
        for spatial, channel in zip(mixer.spatial, mixer.channel):
            assert spatial[0].groups == 16 and spatial[0].kernel_size == (3, 3)  # depthwise
            for part, given in [(spatial, h), (channel, h + spatial(h))]:  # each a convolution, GELU, BatchNorm
                assert torch.equal(part(given), part[2](F.gelu(part[0](given))))
            h = channel(h + spatial(h))
        assert torch.allclose(mixer(img), mixer.head(h.mean((2, 3))), atol=1e-5)


@pytest.mark.parametrize("size", [28, 32])
def test_the_cnn_pools_once_to_half_the_resolution(size):
    model = CNN(channels=1, size=size, classes=10).eval()
    assert [type(m) for m in model.net] == [nn.Conv2d, nn.LeakyReLU, nn.Conv2d, nn.LeakyReLU, nn.MaxPool2d, nn.Flatten,
                                            nn.Linear, nn.LeakyReLU, nn.Linear]  # each layer, then its activation
    assert model.net[:5](torch.randn(2, 1, size, size)).shape == (2, 32, size // 2, size // 2)
    assert model(torch.randn(2, 1, size, size)).shape == (2, 10)
