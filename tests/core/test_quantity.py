import pytest

from gpupool.core.quantity import QuantityError, parse_cores_percent, parse_memory_mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [("10Gi", 10240), ("512Mi", 512), ("2048", 2048), ("1Ti", 1048576), (" 3 Gi ", 3072),
     ("1G", 953), ("1.5Gi", 1536), (4096, 4096)],  # 1G = 1e9 B = 953.67 MiB, rounded down
)
def test_memory_quantities(text: str | int, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize(("text", "fragment"), [("-5Gi", "negative"), ("10Qi", "unknown unit"),
                                                 ("ten", "expected a number"), (-1, "negative")])
def test_bad_memory_says_why(text: str | int, fragment: str) -> None:
    with pytest.raises(QuantityError, match=fragment):
        parse_memory_mib(text)


def test_cores_percent() -> None:
    assert parse_cores_percent("30%") == 30
    assert parse_cores_percent("100") == 100
    for bad in ("150%", "0", "-3", "abc", "12.5"):
        with pytest.raises(QuantityError, match="cores"):
            parse_cores_percent(bad)
