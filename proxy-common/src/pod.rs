// SAFETY: every type is #[repr(C)], Copy, and has explicit padding (checked by
// the layout asserts in lib.rs), so any byte pattern is a valid value.
unsafe impl aya::Pod for crate::ServiceKey {}
unsafe impl aya::Pod for crate::ServiceValue {}
unsafe impl aya::Pod for crate::slots::SlotPair {}
unsafe impl aya::Pod for crate::Backend {}
unsafe impl aya::Pod for crate::CtKey {}
unsafe impl aya::Pod for crate::CtValue {}
unsafe impl aya::Pod for crate::ct_table::CtSlot {}
unsafe impl aya::Pod for crate::ct_table::CtSlot6 {}
// For both families at once: the agent's conntrack table is generic over them.
unsafe impl<F: crate::ct_table::SlotFamily> aya::Pod for crate::ct_table::CtWideSlotOf<F> {}
unsafe impl aya::Pod for crate::DatapathConfig {}
unsafe impl aya::Pod for crate::IfaceInfo {}
unsafe impl aya::Pod for crate::Ipv4Prefix {}
unsafe impl aya::Pod for crate::SourceRange {}
unsafe impl aya::Pod for crate::SockKey {}
unsafe impl aya::Pod for crate::SockValue {}
unsafe impl aya::Pod for crate::MonitorEvent {}
unsafe impl aya::Pod for crate::MonitorSlot {}
unsafe impl aya::Pod for crate::ServiceKey6 {}
unsafe impl aya::Pod for crate::Backend6 {}
unsafe impl aya::Pod for crate::CtKey6 {}
unsafe impl aya::Pod for crate::CtValue6 {}
unsafe impl aya::Pod for crate::Ipv6Prefix {}
unsafe impl aya::Pod for crate::SourceRange6 {}
unsafe impl aya::Pod for crate::SockKey6 {}
unsafe impl aya::Pod for crate::SockValue6 {}
unsafe impl aya::Pod for crate::MonitorEvent6 {}
unsafe impl aya::Pod for crate::DatapathConfig6 {}
unsafe impl aya::Pod for crate::AffinityKey {}
unsafe impl aya::Pod for crate::AffinityKey6 {}
unsafe impl aya::Pod for crate::AffinityValue {}
unsafe impl aya::Pod for crate::maglev::MaglevChunk {}
