from grpo_aug.junk_chars import junk_count, script


def test_scripts():
    assert [script(c) for c in "aЖ中7 "] == ["LATIN", "CYRILLIC", "CJK", None, None]


def test_junk_by_hand():
    q = "Q: What is 2 + 3?\nA: "
    assert junk_count([q], ["5\n#### 5"]) == (0, 8)
    assert junk_count([q], ["\ufffd5"]) == (1, 2)  # undecodable bytes
    assert junk_count([q], ["5\x00\x07"]) == (2, 3)  # control characters
    assert junk_count([q], ["5\u200b"]) == (1, 2)  # zero-width space (format character)
    assert junk_count([q], ["пять five 五"]) == (5, 11)  # 4 Cyrillic + 1 CJK letters in a Latin prompt
    assert junk_count(["Вопрос: 2+3?"], ["пять"]) == (0, 4)  # the prompt's own script is fine
    assert junk_count(["12+7="], ["19abc"]) == (0, 5)  # no letters in the prompt: letters not judged
    assert junk_count([q, q], ["5", "\ufffd"]) == (1, 2)
