// Package metallbimport translates MetalLB's configuration (its
// metallb.io IPAddressPools, BGPPeers, BGPAdvertisements, Communities and
// BFDProfiles, as MetalLB 0.14 and 0.15 serve them) into vipcast's IPPools
// and BGPPeers, for `kubectl vipcast import metallb`.
//
// Decode reads the objects strictly: a field MetalLB does not have is an
// error naming the object and the field. Translate carries every field
// vipcast has an equivalent for, names in a Note every one it leaves
// behind and why (L2 advertisements, a BGPPeer's connectTime or routerID,
// a BFDProfile's echo mode), and refuses, naming each part and why, a
// configuration it would translate into something that means otherwise
// (two advertisements of one pool that disagree, several node selectors
// that vipcast cannot OR, a VRF, an unnumbered peer). The pools it
// produces are checked with vipcast-ccm's own admission (poolspec.Admit).
//
// It is pure: reading the objects from a cluster or files and applying
// the result are the plugin's.
package metallbimport
