from drafters.training.split import key_fraction, split_keys


def test_split_is_a_pure_function_of_each_key():
    keys = [f"tenant-a/req-{i}.safetensors" for i in range(200)]
    train, held = split_keys(keys, 0.2)
    assert set(train) | set(held) == set(keys) and not set(train) & set(held)
    assert 20 <= len(held) <= 60  # ~20 % by hash
    # adding and evicting samples never moves a sample across the split
    train2, held2 = split_keys(keys[50:] + [f"tenant-a/new-{i}.safetensors" for i in range(50)], 0.2)
    assert set(held2) & set(keys) == set(held) & set(keys[50:])
    assert set(train2) & set(keys) == set(train) & set(keys[50:])
    assert all((key_fraction(k) < 0.2) == (k in held) for k in keys)


def test_at_least_one_held_out_and_one_trained():
    for n in (2, 3, 5):
        keys = [f"t/x{i}" for i in range(n)]
        train, held = split_keys(keys, 0.2)
        assert len(held) >= 1 and len(train) >= 1
        assert split_keys(keys, 0.2) == (train, held)
    assert split_keys(["t/only"], 0.2) == (["t/only"], [])
    assert split_keys([f"t/{i}" for i in range(5)], 0.0) == ([f"t/{i}" for i in range(5)], [])
