"""The one registry pattern (``hybridkv.core.registry.Registry``): names, errors, MRO lookup."""

from __future__ import annotations

import pytest

from hybridkv.core.registry import Registry


def test_named_registry_keeps_order_and_names_every_valid_key_in_errors() -> None:
    reg: Registry[int] = Registry("widget")

    @reg.register("b")
    class B:
        pass

    assert reg.register("a", 7) == 7
    assert reg.names() == ("b", "a") and reg.keys() == ("b", "a") and len(reg) == 2
    assert reg.get("b") is B and reg.get("a") == 7 and "a" in reg and "c" not in reg
    assert reg.items() == (("b", B), ("a", 7)) and list(reg) == ["b", "a"]
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; valid: b, a$"):
        reg.get("c")
    with pytest.raises(ValueError, match=r"^unknown widget 3; valid: b, a$"):
        reg.get(3)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 8)
    assert reg.get("a") == 7                     # a refused registration changes nothing
    for bad in ("", 5, None):
        with pytest.raises(ValueError, match="widget name must be a non-empty string"):
            reg.register(bad, 1)
    assert "widget" in repr(reg) and "b, a" in repr(reg)


def test_type_registry_resolves_the_nearest_registered_base() -> None:
    class Base:
        pass

    class Mid(Base):
        pass

    class Leaf(Mid):
        pass

    class Other:
        pass

    reg: Registry[str] = Registry("handler", by_type=True, key_base=Base)
    reg.register(Base, "base")
    assert reg.get(Leaf) == "base" and Leaf in reg
    reg.register(Mid, "mid")
    assert reg.get(Leaf) == "mid" and reg.get(Base) == "base"
    assert reg.names() == ("Base", "Mid")
    with pytest.raises(ValueError, match=r"^no handler is registered for Other; registered: Base, Mid$"):
        reg.get(Other)
    assert Other not in reg and Base() not in reg      # instances are not keys
    with pytest.raises(ValueError, match="registered for a Base subclass, got <class"):
        reg.register(Other, "x")
    with pytest.raises(ValueError, match="registered for a Base subclass, got 'Leaf'"):
        reg.register("Leaf", "x")


def test_value_base_is_checked_at_registration() -> None:
    class Contract:
        pass

    reg: Registry[type] = Registry("plugin", value_base=Contract)
    with pytest.raises(ValueError, match="plugin must be a Contract subclass, got <class 'int'>"):
        reg.register("n", int)
    with pytest.raises(ValueError, match="plugin must be a Contract subclass, got 3"):
        reg.register("n", 3)
    assert len(reg) == 0

    @reg.register("ok")
    class Impl(Contract):
        pass

    assert reg.get("ok") is Impl


def test_a_type_registry_without_a_key_base_takes_any_class_and_refuses_the_rest() -> None:
    """``by_type`` without ``key_base``: any class is a key (``object`` is the implied base);
    a non-class key is refused with a message that names "class" as what was expected."""
    table: Registry[str] = Registry("handler", by_type=True)
    table.register(int, "number")
    assert table.get(bool) == "number" and table.names() == ("int",)
    with pytest.raises(ValueError, match=r"^a handler is registered for a class subclass, got 'int'$"):
        table.register("int", "name")
    with pytest.raises(ValueError, match=r"^no handler is registered for str; registered: int$"):
        table.get(str)
