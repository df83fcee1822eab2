"""torchvision's ResNet-50 and ViT-B/16 (no weights) for ``mpsim import-torch`` tests where torchvision is installed."""


def resnet50():
    from torchvision.models import resnet50 as build

    return build()


def vit_b_16():
    from torchvision.models import vit_b_16 as build

    return build()
