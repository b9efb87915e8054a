-- acquire_next: take the lease of some inbox that has work and no live holder.
WITH {pick_lease},
{take_lease}
SELECT inbox_id, generation, now, free, old_holder, old_until FROM taken
