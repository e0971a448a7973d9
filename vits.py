"""The transformers vision.py compares with the MLPs and convnets, hand-written: ViT-small of Lee et al. (2021), as the
authors' code has it (shifted patch tokens, locality self-attention, a class token read by the head), and ViT-simple
of Beyer et al. (2022). vision.build_model builds them from its flags."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import patchify


class FeedForward(nn.Module):
    """The transformer's MLP, pre-norm: LayerNorm, dim -> hidden -> dim with GELU."""

    def __init__(self, dim, hidden, dropout, norm=True):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim) if norm else nn.Identity(), nn.Linear(dim, hidden), nn.GELU(),
                                 nn.Dropout(dropout),
                                 nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x, tokens=None):
        """tokens: x holds the first rows of that many tokens (training on the read token alone, see ViT): each
        dropout draws its mask for every token and keeps these rows, the random draws of computing them all."""
        if tokens is None or not self.training:
            return self.net(x)
        norm, fc1, gelu, drop1, fc2, drop2 = self.net
        return dropout_rows(fc2(dropout_rows(gelu(fc1(norm(x))), drop1.p, tokens)), drop2.p, tokens)


def dropout_rows(x, p, tokens, dim=1):
    """Training dropout of x, the first rows (along dim) of `tokens` rows: the mask is drawn for all of them, as
    F.dropout draws it for the whole tensor (on a CPU in order, row after row), then cut to x's rows."""
    full = list(x.shape)
    full[dim] = tokens
    return x * F.dropout(x.new_ones(full), p)[tuple(map(slice, x.shape))]  # the mask, scaled by 1 / (1 - p)


class Attention(nn.Module):
    """Multi-head self-attention, pre-norm. lsa=True is Locality Self-Attention (Lee et al. 2021): a learned
    temperature in place of 1/sqrt(d_head), and no token attends to itself (the diagonal is masked)."""

    def __init__(self, dim, heads, dim_head, dropout, lsa=False, norm=True):
        super().__init__()
        self.heads, self.dropout, self.lsa = heads, dropout, lsa
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)  # queries, keys and values of every head at once
        self.out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))
        # LSA learns the scale, starting at the usual 1/sqrt(d_head); kept as a log so it stays positive
        self.log_temperature = nn.Parameter(torch.tensor(math.log(dim_head**-0.5))) if lsa else None

    def forward(self, x, rows=None):
        """rows: the outputs of the first `rows` tokens only (their queries over every token's keys); None: all."""
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        q = q[:, :, :rows]  # (B, nh, rows, hs); [:None] keeps every row
        mask, scale = None, None
        if self.lsa:
            mask = ~torch.eye(T, dtype=torch.bool, device=x.device)[:rows]  # True = may attend; query i is token i
            q = q * self.log_temperature.exp()  # the learned scale
            scale = 1.0
        if self.training and rows is not None:  # the read token alone in training: the same formula by hand, with
            # the attention dropout's mask drawn for every query, as the fused call draws it, and cut to these rows
            scores = q @ k.transpose(-2, -1) * (scale or q.shape[-1] ** -0.5)
            scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
            y = dropout_rows(scores.softmax(-1), self.dropout, T, dim=2) @ v
            fc, drop = self.out
            return dropout_rows(fc(y.transpose(1, 2).reshape(B, rows, -1)), drop.p, T)
        # softmax(q k^T * scale + mask) v, fused; the explicit form runs 2x slower on a CPU
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, q.shape[2], -1))  # heads side by side, (B, rows, dim)


class Transformer(nn.Module):
    """depth pre-norm blocks (attention, then MLP, each added to the residual stream) and a final LayerNorm;
    block_norm=False drops the LayerNorm in front of each attention and MLP."""
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout, lsa=False, block_norm=True):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleList([Attention(dim, heads, dim_head, dropout, lsa, block_norm),
                                                    FeedForward(dim, mlp_dim, dropout, block_norm)])
                                     for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, rows=None):
        """rows: the last block computes the first `rows` tokens only (those a head reads); None: every token."""
        for i, (attn, ff) in enumerate(self.layers):
            keep = rows if i == len(self.layers) - 1 else None  # no later block reads the last block's other tokens
            T = x.shape[1]
            x = x[:, :keep] + attn(x, keep)  # each token reads the others
            x = x + ff(x, None if keep is None else T)  # then each is transformed on its own
        return self.norm(x)


class ShiftedPatchTokenization(nn.Module):
    """SPT (Lee et al. 2021): the image and four shifted copies, stacked on the channels, cut into patches,
    layer-normalised (unless patch_norm=False) and projected, so each token sees a little beyond its own patch.
    shift '1': one pixel in four directions (the authors' vit_small.py); 'half': half a patch diagonally (Lee et al.)"""

    def __init__(self, channels, patch, dim, patch_norm=True, shift="1"):
        super().__init__()
        self.patch = patch
        s = patch // 2 if shift == "half" else 1
        # F.pad amounts (left, right, top, bottom); a negative amount crops, so each pad moves the image
        self.shifts = ([(s, -s, s, -s), (-s, s, s, -s), (s, -s, -s, s), (-s, s, -s, s)] if shift == "half"
                       else [(s, -s, 0, 0), (-s, s, 0, 0), (0, 0, s, -s), (0, 0, -s, s)])
        self.norm = nn.LayerNorm(5 * channels * patch * patch) if patch_norm else nn.Identity()
        self.proj = nn.Linear(5 * channels * patch * patch, dim)

    def forward(self, img):
        x = torch.cat([img] + [F.pad(img, pad) for pad in self.shifts], dim=1)  # (B, 5C, H, W): image + 4 shifts
        return self.proj(self.norm(patchify(x, self.patch)))  # (B, T, dim)


class ViT(nn.Module):
    """ViT-small of Lee et al. (2021): SPT tokens, a class token, learned positions, LSA blocks, head on the class."""

    def __init__(self, *, image, channels, patch, classes, dim, depth, heads, dim_head, mlp_dim, dropout,
                 patch_norm=True, block_norm=True, spt_shift="1"):
        super().__init__()
        self.tokens = ShiftedPatchTokenization(channels, patch, dim, patch_norm, spt_shift)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))  # the class token, read by the head
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim))  # one per patch, and the class's
        self.drop = nn.Dropout(dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout, lsa=True, block_norm=block_norm)
        self.head = nn.Linear(dim, classes)

    def embed(self, img):
        """The tokens the blocks read: the class token, then the SPT tokens, plus the positions, (B, T + 1, dim)."""
        x = self.tokens(img)  # (B, T, dim)
        return torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos

    def forward(self, img):
        x = self.embed(img)
        # the last block computes the class token alone, all the head reads: the same logits up to float rounding,
        # 1.25x faster evaluating, 1.2x training. Training draws every token's dropout masks, so the random draws are
        # those of computing them all, except on a GPU, whose fused dropout draws otherwise: there it computes them all
        rows = 1 if not self.training or x.device.type == "cpu" else None
        return self.head(self.transformer(self.drop(x), rows)[:, 0])  # the class token


def sincos_2d(h, w, dim, temperature=10000.0):
    """Fixed 2-D sine-cosine position embedding (h*w, dim) of Beyer et al. (2022)."""
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")  # each patch's row and column
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))  # dim/4 frequencies per axis and function
    y, x = y.flatten()[:, None] * omega, x.flatten()[:, None] * omega  # (h*w, dim/4)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


class SimpleViT(nn.Module):
    """ViT-simple of Beyer et al. (2022): plain patches, fixed sin-cos positions, no dropout, mean pooling."""

    def __init__(self, *, image, channels, patch, classes, dim, depth, heads, dim_head, mlp_dim, patch_norm=True,
                 block_norm=True):
        super().__init__()
        self.patch = patch
        patch_dim = channels * patch * patch
        self.embed = nn.Sequential(nn.LayerNorm(patch_dim) if patch_norm else nn.Identity(), nn.Linear(patch_dim, dim),
                                   nn.LayerNorm(dim))  # raw patch -> token, normalised before and after
        self.register_buffer("pos", sincos_2d(image // patch, image // patch, dim))
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout=0.0, block_norm=block_norm)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        x = self.embed(patchify(img, self.patch)) + self.pos  # (B, T, dim)
        return self.head(self.transformer(x).mean(1))  # mean over the tokens: no class token
