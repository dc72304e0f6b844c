"""The engine tests' own projects of other shapes than (one input tensor, targets), on the bundled digits:

- ``TwoInputs`` + ``TwoInputNet``: each sample ``({"image": 1x8x8, "tabular": 5 features}, class)``, two named inputs
  (the table's features in other units than the image's, so each needs statistics of its own);
- ``Unlabelled`` + ``Contrastive`` + ``Embedder``: no targets; two views of each image, one with noise drawn in the
  step, and an InfoNCE loss whose negatives are the batch's other samples (it declares what it cannot promise);
- ``Unlabelled`` + ``GAN`` + ``GANNets``: no targets; a generator and a discriminator, each with its own optimizer and
  schedule, stepped by the task (manual optimization).

tests/configs/two_inputs.yaml, contrastive.yaml and gan.yaml select them over tests/configs/digits.yaml; the contract
suite runs on each. Small on purpose, as toy.py."""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset
from toy import Digits

from project.engine import DataModule, Task


class _Samples(Dataset):
    def __init__(self, digits: Dataset, shape: str) -> None:
        self.digits, self.shape = digits, shape

    def __len__(self) -> int:
        return len(self.digits)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        image, label = self.digits[i]
        if self.shape == "unlabelled":
            return image
        quadrants = image[0].unflatten(0, (2, 4)).unflatten(2, (2, 4)).mean((1, 3)).flatten()  # 4 means
        tabular = torch.cat([quadrants, image.std().view(1)]) * 100.0 + 7.0  # other units than the image's
        return {"image": image, "tabular": tabular}, label


class TwoInputs(Digits):
    """The digits as two named inputs and their class."""

    def __init__(self, **engine: Any) -> None:
        super().__init__(**engine)
        self.input_shape = {"image": (1, 8, 8), "tabular": (5,)}  # type: ignore[assignment]

    load_predict_inputs = DataModule.load_predict_inputs  # the engine's: a .npz file, an array per input

    def load_dataset(self) -> Dataset:
        return _Samples(super().load_dataset(), "two_inputs")


class Unlabelled(Digits):
    """The digits' images alone: data without targets."""

    target_kind = None

    def __init__(self, **engine: Any) -> None:
        super().__init__(**engine)
        self.target_names = []

    def load_dataset(self) -> Dataset:
        return _Samples(super().load_dataset(), "unlabelled")


class TwoInputNet(nn.Module):
    def __init__(self, input_shape: dict[str, tuple[int, ...]], num_outputs: int, hidden: int = 32) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape["image"]), hidden), nn.ReLU())
        self.tabular = nn.Sequential(nn.Linear(input_shape["tabular"][0], hidden), nn.ReLU())
        self.head = nn.Linear(2 * hidden, num_outputs)

    def forward(self, image: Tensor, tabular: Tensor) -> Tensor:
        return self.head(torch.cat([self.image(image), self.tabular(tabular)], dim=1))


class Embedder(nn.Module):
    """An image -> a unit-length embedding."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, width: int = 16) -> None:
        super().__init__()
        size = math.prod(input_shape)
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(size, 64), nn.ReLU(), nn.Linear(64, width))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.layers(x), dim=-1)


class Contrastive(Task):
    """SimCLR's InfoNCE on two views of each image: the image, and the image with noise (drawn in the step while
    training, from the global RNG the checkpoint keeps; a fixed shift when evaluating). Its forward embeds both views,
    which the loss compares; a prediction and the exported model are the image's own embedding."""

    target_kind = None
    cannot_promise = {  # noqa: RUF012
        "accumulation_equals_the_big_batch": "in-batch negatives: a micro-batch's loss is no share of the big batch's",
        "two_processes_equal_one": "in-batch negatives: each process's negatives are its own batch's",
    }

    def __init__(self, *args: Any, temperature: float = 0.2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.temperature = temperature

    def forward(self, inputs: Tensor) -> Tensor:
        other = inputs + 0.3 * torch.randn_like(inputs) if self.training else inputs.roll(1, dims=-1)
        return torch.stack([self.net(inputs), self.net(other)], dim=1)  # (batch, 2 views, width)

    def loss(self, outputs: Tensor, targets: None) -> Tensor:
        similarity = outputs[:, 0] @ outputs[:, 1].T / self.temperature  # each sample's other view is its positive
        return F.cross_entropy(similarity, torch.arange(len(outputs), device=outputs.device), reduction="none")

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs[:, 0]  # the image's own embedding

    def output_head(self) -> nn.Module:
        return _FirstView()  # the exported model gives the image's own embedding

    def output_description(self) -> dict[str, Any]:
        return {"name": "embeddings", "shape": ["batch", "width"]}


class _FirstView(nn.Module):
    def forward(self, outputs: Tensor) -> Tensor:
        return outputs[:, 0]


class GANNets(nn.Module):
    """A generator (noise -> an image) and a discriminator (an image -> a logit: real or not); called on images, the
    net is the discriminator (what validation, predict and export run)."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, latent: int = 16) -> None:
        super().__init__()
        self.input_shape, self.latent = tuple(input_shape), latent
        size = math.prod(input_shape)
        self.generator = nn.Sequential(nn.Linear(latent, 64), nn.ReLU(), nn.Linear(64, size), nn.Sigmoid())
        self.discriminator = nn.Sequential(nn.Flatten(), nn.Linear(size, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def generate(self, noise: Tensor) -> Tensor:
        return self.generator(noise).view(-1, *self.input_shape)

    def forward(self, images: Tensor) -> Tensor:
        return self.discriminator(images).squeeze(-1)


class GAN(Task):
    """A generator against a discriminator, each with its optimizer (``model.optimizers``: discriminator, generator),
    stepped once per batch each; the noise drawn in the step. Its loss is the discriminator's on real images."""

    target_kind = None
    cannot_promise = {  # noqa: RUF012
        "learns_one_batch_by_heart": "adversarial: the generator's loss rises as the discriminator's falls",
        "two_processes_equal_one": "noise drawn in the step: each process draws its own, not a share of one",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def loss(self, outputs: Tensor, targets: None) -> Tensor:
        return F.binary_cross_entropy_with_logits(outputs, torch.ones_like(outputs), reduction="none")

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        nets: Any = self.net
        noise = torch.randn(len(batch), nets.latent, device=batch.device)
        fake = nets.generate(noise)
        real_logits, fake_logits = nets(batch), nets(fake.detach())
        d_loss = self.loss(real_logits, None).mean() + F.binary_cross_entropy_with_logits(
            fake_logits, torch.zeros_like(fake_logits)
        )
        self.manual_step("discriminator", d_loss)
        g_loss = self.loss(nets(fake), None).mean()  # the generator wants its images taken for real
        self.manual_step("generator", g_loss)
        self.log_dict({"train/loss": d_loss.detach(), "train/g_loss": g_loss.detach()})

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs.sigmoid()  # the probability that each input is real: one value per input, (batch,)


class StagedGAN(GAN):
    """The GAN trained in stages: the discriminator alone for its first ``switch_at`` batches, the generator alone
    after (each stage a part stepping, the other still)."""

    def __init__(self, *args: Any, switch_at: int = 3, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.switch_at = switch_at
        self.steps = {"discriminator": 0, "generator": 0}

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        nets: Any = self.net
        fake = nets.generate(torch.randn(len(batch), nets.latent, device=batch.device))
        if self.trainer.fit_loop.epoch_loop.batch_progress.total.completed < self.switch_at:
            part, loss = (
                "discriminator",
                self.loss(nets(batch), None).mean()
                + F.binary_cross_entropy_with_logits(nets(fake.detach()), torch.zeros(len(batch), device=batch.device)),
            )
        else:
            part, loss = "generator", self.loss(nets(fake), None).mean()
        self.manual_step(part, loss)
        self.steps[part] += 1
        self.log("train/loss", loss.detach())

    def output_description(self) -> dict[str, Any]:
        return {"name": "logits", "shape": ["batch"]}


class OwnStepsGAN(GAN):
    """The GAN stepping its optimizers and schedules itself, as Lightning's manual-optimization docs teach
    (``opt.step()``, ``sch.step()``), not through ``manual_step``."""

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        nets: Any = self.net
        (d_opt, g_opt), (d_sch, g_sch) = self.optimizers(), self.lr_schedulers()  # type: ignore[misc]
        fake = nets.generate(torch.randn(len(batch), nets.latent, device=batch.device))
        d_loss = self.loss(nets(batch), None).mean() + F.binary_cross_entropy_with_logits(
            nets(fake.detach()), torch.zeros(len(batch), device=batch.device)
        )
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        d_sch.step()
        g_loss = self.loss(nets(fake), None).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        g_sch.step()
        self.log("train/loss", d_loss.detach())
