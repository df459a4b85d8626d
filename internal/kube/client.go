package kube

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is the client configuration of a kubeconfig file, or the
// in-cluster one for "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w (pass --kubeconfig outside a cluster)", err)
	}
	return rc, nil
}
