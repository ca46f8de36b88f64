package speaker

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// The watches of the Secrets BGP passwords and BFD keys come from, each
// by name, and the lookup the peers' sessions use.

// watchSecrets creates a Secret informer for each Secret BGP passwords
// and BFD keys may come from (Options.PasswordSecrets): namespaced, with
// the field selector metadata.name=<name>, the only list and watch the
// API server authorizes with RBAC resourceNames, so the speaker needs no
// access to the other Secrets of the namespace. A change of a Secret's
// data recomputes the sessions; the cached Secrets keep only their name,
// namespace and data.
func (w *watched) watchSecrets(opts Options, q workqueue.TypedRateLimitingInterface[string]) error {
	w.secrets = map[types.NamespacedName]cache.SharedIndexInformer{}
	for _, k := range opts.PasswordSecrets {
		if _, dup := w.secrets[k]; dup {
			continue
		}
		f := informers.NewSharedInformerFactoryWithOptions(opts.Client, 0,
			informers.WithNamespace(k.Namespace), informers.WithTransform(secretData),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.Name).String()
			}))
		inf := f.Core().V1().Secrets().Informer()
		if _, err := inf.AddEventHandler(configHandler(q, sameSecret)); err != nil {
			return fmt.Errorf("secret event handler for %s: %w", k, err)
		}
		w.secrets[k] = inf
		w.secretFactories = append(w.secretFactories, f)
	}
	return nil
}

// secretData is the Secret informers' transform: it keeps a Secret's name,
// namespace and data, dropping what could hold another copy of the data
// (the last-applied annotation, managed fields).
func secretData(obj any) (any, error) {
	s, ok := obj.(*v1.Secret)
	if !ok {
		return obj, nil
	}
	return &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion},
		Data:       s.Data,
	}, nil
}

// sameSecret reports whether a Secret update leaves its data unchanged.
func sameSecret(old, cur any) bool {
	o, ok1 := old.(*v1.Secret)
	n, ok2 := cur.(*v1.Secret)
	return ok1 && ok2 && maps.EqualFunc(o.Data, n.Data, bytes.Equal)
}

// passwords returns the lookup PeersForNode uses for TCP MD5 passwords
// and BFD keys, read from the Secret informers' caches: only a confirmed
// deletion or change of a Secret changes a session, never an unreachable
// API server. A Secret the speaker does not watch is refused with the fix.
func (w *watched) passwords() func(*vipcastv1alpha1.SecretKeyReference) (string, error) {
	return func(ref *vipcastv1alpha1.SecretKeyReference) (string, error) {
		k := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
		inf, ok := w.secrets[k]
		if !ok {
			return "", fmt.Errorf("secret %s is not one the speaker may read (%s): add %s to the speaker's --bgp-password-secrets (chart value speaker.bgpPasswordSecrets.secrets)",
				k, w.passwordSecrets(), k)
		}
		obj, exists, err := inf.GetStore().GetByKey(k.String())
		if err != nil {
			return "", fmt.Errorf("secret %s from cache: %w", k, err)
		}
		s, isSecret := obj.(*v1.Secret)
		if !exists || !isSecret {
			return "", fmt.Errorf("secret %s not found: create it with the key %q", k, ref.KeyOrDefault())
		}
		v, ok := s.Data[ref.KeyOrDefault()]
		if !ok {
			return "", fmt.Errorf("secret %s has no key %q: add it, or set passwordSecretRef.key to the key that holds the password", k, ref.KeyOrDefault())
		}
		return string(v), nil
	}
}

// maxNamedSecrets is how many of the Secrets it reads passwordSecrets
// names before it counts the rest: a message goes into an Event.
const maxNamedSecrets = 5

// passwordSecrets names the Secrets passwords are read from, for
// messages.
func (w *watched) passwordSecrets() string {
	if len(w.secrets) == 0 {
		return "it reads none: --bgp-password-secrets is empty"
	}
	names := make([]string, 0, len(w.secrets))
	for k := range w.secrets {
		names = append(names, k.String())
	}
	slices.Sort(names)
	if n := len(names); n > maxNamedSecrets {
		names = append(names[:maxNamedSecrets], fmt.Sprintf("and %d more", n-maxNamedSecrets))
	}
	return "it reads " + strings.Join(names, ", ")
}
