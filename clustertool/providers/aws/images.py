"""Which machine image to boot: --ami, else the Deep Learning AMI from its public SSM
parameter, else the newest matching ``describe_images`` name."""

from __future__ import annotations

from dataclasses import dataclass

from clustertool.core.errors import ProviderError, UsageError
from clustertool.providers.aws.client import Aws, aws_errors, is_code

# /aws/service/deeplearning/ami/<arch>/<ami type>/latest/ami-id (AWS DLAMI documentation)
SSM_TYPES = ("base-oss-nvidia-driver-gpu-ubuntu-22.04", "base-oss-nvidia-driver-ubuntu-22.04")
NAME_PATTERNS = ("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*", "Deep Learning*")


@dataclass
class Image:
    id: str
    name: str
    root_device: str
    source: str  # how it was chosen, for the user

    def describe(self) -> str:
        return f"{self.id} ({self.name or 'unnamed'}; {self.source})"


def ssm_parameter(arch: str, ami_type: str) -> str:
    return f"/aws/service/deeplearning/ami/{arch}/{ami_type}/latest/ami-id"


def resolve(aws: Aws, ami: str | None, arch: str = "x86_64") -> Image:
    if ami:
        return _by_id(aws, ami, "--ami")
    for ami_type in SSM_TYPES:
        name = ssm_parameter(arch, ami_type)
        image_id = _ssm_value(aws, name)
        if image_id:
            return _by_id(aws, image_id, f"SSM parameter {name}")
    for pattern in NAME_PATTERNS:
        image = _newest(aws, pattern, arch)
        if image:
            return image
    raise ProviderError(f"no Deep Learning AMI found in {aws.region} for {arch}",
                        hint="pass --ami ami-... with an image that has the NVIDIA driver")


def _ssm_value(aws: Aws, name: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        return aws.call("get_parameter", "ssm", Name=name)["Parameter"]["Value"]
    except ClientError as exc:
        if is_code(exc, "ParameterNotFound", "AccessDeniedException", "ValidationException"):
            return None
        raise


def _by_id(aws: Aws, image_id: str, source: str) -> Image:
    from botocore.exceptions import ClientError

    try:
        found = aws.call("describe_images", ImageIds=[image_id]).get("Images", [])
    except ClientError as exc:
        if is_code(exc, "InvalidAMIID"):
            found = []
        else:
            with aws_errors("describing the image"):
                raise
    if not found:
        raise UsageError(f"{source}: image {image_id} not found in {aws.region}",
                         hint="AMI ids are per region; check --ami and --region")
    return _image(found[0], source)


def _newest(aws: Aws, pattern: str, arch: str) -> Image | None:
    with aws_errors("searching for a Deep Learning AMI"):
        images = aws.call("describe_images", Owners=["amazon"], Filters=[
            {"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]},
            {"Name": "architecture", "Values": [arch]}]).get("Images", [])
    if not images:
        return None
    newest = max(images, key=lambda i: (i.get("CreationDate", ""), i.get("Name", "")))
    return _image(newest, f"newest image named like {pattern!r}")


def _image(data: dict, source: str) -> Image:
    return Image(id=data["ImageId"], name=data.get("Name", ""),
                 root_device=data.get("RootDeviceName") or "/dev/sda1", source=source)
