from services.policy.batch import completion_values, length_buckets, pack


def test_pack_aligns_completion_mask_with_next_token_targets():
    b = pack([[1, 5, 6], [1, 7]], [[8, 2], [9, 9, 2]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 5, 6, 8, 2], [1, 7, 9, 9, 2]]
    # targets are input_ids[:, 1:]; completion targets: row0 -> 8, 2 ; row1 -> 9, 9, 2
    targets = b.input_ids[:, 1:]
    assert targets[b.completion_mask.bool()].tolist() == [8, 2, 9, 9, 2]
    vals = completion_values(b, [3, 2], [[-1.0, -2.0], [-3.0, -4.0, -5.0]])
    assert vals[b.completion_mask.bool()].tolist() == [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert vals.sum() == -15.0


def test_length_buckets_bound_padded_tokens_and_cover_all():
    lengths = [5, 100, 6, 7, 50, 5, 300]
    buckets = length_buckets(lengths, max_tokens=120)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 120
